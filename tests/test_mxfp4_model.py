"""A tiny Qwen3-MoE checkpoint whose experts are MXFP4 (fresh random bytes, stored as GPT-OSS stores them) built
and served, against transformers running the same model on its own dequantization of those bytes (fp32).

The bound: the two run on the same weights bit for bit (the dequantization is exact, ops/mxfp4.py, and both read the
same values: tests/test_mxfp4.py), so what differs is only the order of float32 sums (attention, the experts'
index_add against transformers' per-expert loop, the matmuls' blocking), a few float32 ulps of each logit. The
unquantized families' fp32 parity shows the same; 1e-4 of the logits' scale leaves ~100x room above it and is far
below the gap between the top two logits that greedy decoding reads."""
import json

import pytest
import torch
from safetensors.torch import load_file

from artifact_tools import PREFILL_PROMPTS, prefill_logits
from factories import hf_greedy, make_tiny_model, random_prompts
from mxfp4_checks import write_mxfp4_moe
from test_moe_models import MAX_NEW, engine_greedy

from atom_aot.artifact.reader import Artifact
from atom_aot.runtime.inspect import describe


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """(mxfp4 folder, its dequantized twin): 3 layers, the middle one dense, 4 experts of width 32, top-2."""
    root = tmp_path_factory.mktemp("mxfp4")
    src = make_tiny_model(root / "src", "Qwen3MoeForCausalLM", seed=5, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[1])
    return write_mxfp4_moe(src, root / "mxfp4", root / "reference", seed=6)


@pytest.fixture(scope="module")
def artifact(checkpoints, build_artifact):
    return build_artifact(checkpoints[0], compile="none")


def test_the_artifact_keeps_the_checkpoints_bytes(checkpoints, artifact):
    """No widening at build: the stacks are the checkpoint's uint8 blocks and scales, the manifest and inspect say
    mxfp4 experts with unquantized linears."""
    checkpoint = load_file(str(checkpoints[0] / "model.safetensors"))
    art = Artifact.open(artifact)
    weights = load_file(str(art.member_path("weights/rank0.safetensors")))
    for i in (0, 2):
        prefix = f"model.layers.{i}.mlp.experts."
        assert torch.equal(weights[prefix + "w13"], checkpoint[prefix + "gate_up_proj_blocks"].flatten(-2))
        assert torch.equal(weights[prefix + "w2_scale"], checkpoint[prefix + "down_proj_scales"])
        assert weights[prefix + "w13"].dtype == torch.uint8 and weights[prefix + "w13"].shape == (4, 64, 32)
    assert weights["model.layers.0.self_attn.qkv_proj.weight"].dtype == torch.float32
    q = art.manifest.quantization
    assert (q.weights, q.weights_origin) == ("mxfp4", "checkpoint") and set(q.groups.values()) == {"none"}
    assert "experts" in describe(art) and "mxfp4: e2m1" in describe(art)


def test_greedy_output_equals_transformers_on_the_dequantized_weights(checkpoints, artifact):
    prompts = random_prompts(9, 380, seed=21)
    assert engine_greedy(artifact, prompts)[1] == hf_greedy(checkpoints[1], prompts, MAX_NEW)


def test_prefill_logits_within_float32_summation_order(checkpoints, artifact):
    from transformers import AutoModelForCausalLM
    got = prefill_logits(artifact)
    model = AutoModelForCausalLM.from_pretrained(str(checkpoints[1]), dtype=torch.float32).eval()
    with torch.no_grad():
        expected = torch.cat([model(torch.tensor([list(p)])).logits[0] for p in PREFILL_PROMPTS])
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_the_config_is_read_as_shipped(checkpoints):
    assert json.loads((checkpoints[0] / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"
