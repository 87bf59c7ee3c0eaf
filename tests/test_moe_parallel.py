"""Mixture-of-experts layers over tensor-parallel ranks on the CPU (gloo, ranks as processes): each
expert split in width (the default with -tp N) or experts spread whole (--ep). Greedy output of TP-2,
EP-2 and EP-4 artifacts equals TP-1's on tiny Qwen3-MoE and Mixtral models; the expert shards, the
refusals and what the manifest records."""
from __future__ import annotations

import pytest
import torch

from atom_aot.artifact.phase import Phase
from atom_aot.artifact.reader import Artifact
from atom_aot.build.config import BuildConfig
from atom_aot.build.pipeline import plan
from atom_aot.entrypoints.llm import LLMEngine
from atom_aot.errors import BuildError
from atom_aot.models import ModelConfig, model_class
from atom_aot.models.parallel import Split, check_splittable, rank_shapes
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.weights.shard import shard_state_dict
from factories import make_tiny_model, random_prompts
from moe_checks import one_layer_qwen3_moe

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
ENGINE = dict(num_kv_blocks=64, num_threads=1)
FAMILIES = {
    "qwen3moe-8x3-dense1": ("Qwen3MoeForCausalLM", dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32,
                                                        norm_topk_prob=True, mlp_only_layers=[1])),
    "mixtral-4x2": ("MixtralForCausalLM", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def moe_dir(request, tmp_path_factory):
    architecture, overrides = FAMILIES[request.param]
    return make_tiny_model(tmp_path_factory.mktemp("moe-tp") / request.param, architecture, seed=5, **overrides)


def greedy(artifact) -> list[list[int]]:
    engine = LLMEngine(str(artifact), **ENGINE)
    try:
        return [out["token_ids"] for out in engine.generate(random_prompts(5, 300, seed=2), GREEDY)]
    finally:
        engine.close()


def test_tp2_ep2_and_ep4_greedy_equal_tp1(moe_dir, build_artifact):
    expected = greedy(build_artifact(moe_dir, compile="none"))
    tp2 = build_artifact(moe_dir, compile="none", tensor_parallel_size=2)
    assert greedy(tp2) == expected, "tp=2"
    ep2 = build_artifact(moe_dir, compile="none", tensor_parallel_size=2, enable_expert_parallel=True)
    assert Artifact.open(ep2).manifest.layout.expert_parallel_size == 2 and "-tp2-ep-" in ep2.name
    assert greedy(ep2) == expected, "tp=2 --ep"
    if "qwen3moe" in moe_dir.name:      # 8 experts over 4 ranks: 2 each; every token's 3 experts on 2-3 ranks
        assert greedy(build_artifact(moe_dir, compile="none", tensor_parallel_size=4,
                                     enable_expert_parallel=True)) == expected, "tp=4 --ep"


@pytest.mark.parametrize("ep", [False, True])
def test_a_rank_model_takes_its_expert_shard_and_the_shards_add_up(ep):
    """Each rank's eager layer on the whole model's shards: the sum of the ranks' outputs (what the
    all-reduce gives) is the whole layer's output."""
    from atom_aot.distributed import collectives
    cfg, whole = one_layer_qwen3_moe()
    state = whole.state_dict()
    hidden = torch.randn(7, 32)
    block = whole.model.layers[0].mlp
    expected = block(hidden)
    partial_sums = []
    collectives._groups.pop(collectives.TP_GROUP, None)
    collectives.register_stand_in()       # all_reduce returns its input: the rank's own partial sum
    try:
        for rank in range(2):
            with torch.device("meta"):
                part = model_class(cfg.architecture)(cfg, torch.float32, split=Split(2, ep))
            part.load_state_dict(shard_state_dict(state, cfg, Split(2, ep), rank), assign=True)
            partial_sums.append(part.model.layers[0].mlp(hidden))
    finally:
        collectives._groups.pop(collectives.TP_GROUP, None)
    torch.testing.assert_close(partial_sums[0] + partial_sums[1], expected, rtol=1e-5, atol=1e-5)
    local = rank_shapes(cfg, Split(2, ep))
    assert (local.num_experts, local.moe_intermediate_size) == ((3, 24) if ep else (6, 12))


def test_what_does_not_split_is_refused_by_name(moe_dir, tmp_path):
    cfg = ModelConfig.from_hf_dict(__import__("json").loads((moe_dir / "config.json").read_text()))
    with pytest.raises(ValueError, match="num_experts .* is not a multiple of tp"):
        check_splittable(cfg, Split(3 if cfg.num_experts % 3 else 5, ep=True))
    with pytest.raises(BuildError, match="both are 1"):
        plan(str(moe_dir), BuildConfig(arch="cpu", enable_expert_parallel=True))
    dense = make_tiny_model(tmp_path / "dense", "Qwen3ForCausalLM")
    with pytest.raises(BuildError, match="has no experts"):
        plan(str(dense), BuildConfig(arch="cpu", tensor_parallel_size=2, enable_expert_parallel=True))


@pytest.mark.parametrize("moe_dir", ["qwen3moe-8x3-dense1"], indirect=True)
def test_a_compiled_ep2_artifact_shares_one_package_and_matches_tp1(moe_dir, build_artifact):
    """The rank's first expert is a weight (like the embedding's first row), so the ranks' graphs are the
    same and one package serves both: rank 1 must not run with rank 0's experts. The suite's compiled TP-2
    artifact: its Qwen3 attention (QK-norm), dense layer (mlp_only_layers), embedding and lm_head split over
    the ranks as a dense model's do."""
    art = build_artifact(moe_dir, compile="aoti", tensor_parallel_size=2, enable_expert_parallel=True)
    assert Artifact.open(art).manifest.compiled.packages == {Phase.MIXED: "compiled/mixed.pt2"}
    assert "-tp2-" in art.name
    assert greedy(art) == greedy(build_artifact(moe_dir, compile="none"))
    assert build_artifact(moe_dir, compile="aoti", tensor_parallel_size=2, enable_expert_parallel=True) == art  # cached


def test_fp8_experts_are_stored_e4m3_with_row_scales(tmp_path, build_artifact):
    """--quant fp8 on a MoE model: every expert stack in e4m3 with per-row scales (not only the attention
    linears); a TP-2 --ep fp8 artifact serves too (its greedy tokens are
    not compared: row-parallel fp8 linears quantize each rank's half-row activations with their own scales)."""
    from safetensors.torch import load_file
    architecture, overrides = FAMILIES["qwen3moe-8x3-dense1"]
    model = make_tiny_model(tmp_path / "qwen3moe-fp8", architecture, seed=8, **overrides)
    fp8 = build_artifact(model, compile="none", quant="fp8")
    weights = load_file(str(Artifact.open(fp8).member_path("weights/rank0.safetensors")))
    assert weights["model.layers.0.mlp.experts.w13"].dtype == torch.float8_e4m3fn
    assert weights["model.layers.0.mlp.experts.w13_scale"].shape == (8, 64)
    assert weights["model.layers.0.mlp.experts.w2_scale"].shape == (8, weights["model.norm.weight"].shape[0])
    from atom_aot.runtime.inspect import describe
    assert "experts      e4m3, one scale per row, weight-only" in describe(Artifact.open(fp8))
    expected = greedy(fp8)          # accuracy: tests/test_moe_op.py (the op against float64, dequantized and exact)
    ep2 = greedy(build_artifact(model, compile="none", quant="fp8", tensor_parallel_size=2, enable_expert_parallel=True))
    assert [len(tokens) for tokens in ep2] == [len(tokens) for tokens in expected]


@pytest.mark.parametrize("ep", [False, True])
def test_fp8_expert_shards_add_up_to_the_whole_layer(ep):
    """The fp8 experts' scales split with their rows (TP: gate/up halves, w2's whole; EP: whole experts):
    the ranks' partial sums are the one-rank fp8 layer's output."""
    from atom_aot.weights.convert import quantize_weights
    from atom_aot.distributed import collectives
    cfg, whole = one_layer_qwen3_moe()
    with torch.device("meta"):
        one_rank = model_class(cfg.architecture)(cfg, torch.float32, "fp8")
    state = dict(quantize_weights(whole.state_dict(), one_rank.state_dict(), "fp8"))
    one_rank.load_state_dict(state, assign=True)
    assert one_rank.model.layers[0].mlp.experts.w2.dtype == torch.float8_e4m3fn
    hidden = torch.randn(7, 32)
    expected = one_rank.model.layers[0].mlp(hidden)
    partial_sums = []
    collectives._groups.pop(collectives.TP_GROUP, None)
    collectives.register_stand_in()
    try:
        for rank in range(2):
            with torch.device("meta"):
                part = model_class(cfg.architecture)(cfg, torch.float32, "fp8", split=Split(2, ep))
            part.load_state_dict(shard_state_dict(state, cfg, Split(2, ep), rank), assign=True)
            partial_sums.append(part.model.layers[0].mlp(hidden))
    finally:
        collectives._groups.pop(collectives.TP_GROUP, None)
    torch.testing.assert_close(partial_sums[0] + partial_sums[1], expected, rtol=1e-5, atol=1e-5)
