"""GPTQ and AWQ 4-bit checkpoints: detected from config.json, repacked nibble for nibble, run W4A16.

The tiny Llama is saved as GPTQ (group 128 and per channel) and AWQ from the same int4 values, packed by
hand (tests/int4_factories.py); both formats load to the very runtime tensors those values imply, and an
int4 artifact generates the tokens of its twin holding the dequantized weights in float32. Those weights
are exactly representable: (q - z) is a 5-bit integer and s an fp16, so (q - z) * s needs 16 of
float32's 24 significant bits; both artifacts then compute the same float32 product.
"""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from atom_aot.artifact.reader import Artifact
from atom_aot.errors import BuildError
from atom_aot.ops.int4 import pack_nibbles
from atom_aot.runtime.inspect import describe
from atom_aot.weights.quant_config import detect_checkpoint_quant
from factories import make_tiny_model
from int4_factories import awq_config, gptq_config, quantize_rtn, write_int4
from test_prequantized import FUSED, runtime_weights

SCHEMES = {"gptq": "int4-w4a16", "gptq-channel": "int4-w4a16-channel", "awq": "int4-w4a16"}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama-int4", hidden_size=128,
                           intermediate_size=256, num_attention_heads=4, num_key_value_heads=4)


@pytest.fixture(scope="module")
def original(tiny_dir):
    return load_file(str(next(tiny_dir.glob("*.safetensors"))))


def expected_layer(original: dict, layer: int, fused: str, group: int) -> dict[str, torch.Tensor]:
    """The runtime tensors of one fused linear: its parts' int4 values, concatenated along N."""
    values = [quantize_rtn(original[f"model.layers.{layer}.{p}.weight"], group) for p in FUSED[fused]]
    return {"weight": torch.cat([pack_nibbles(v.q) for v in values]),
            "weight_scale": torch.cat([v.scale.float() for v in values]),
            "weight_zero": torch.cat([v.zero.to(torch.uint8) for v in values])}


@pytest.mark.parametrize("fmt", sorted(SCHEMES))
def test_each_format_loads_to_its_runtime_tensors(fmt, tiny_dir, original, tmp_path, build_artifact):
    checkpoint = write_int4(tiny_dir, tmp_path / fmt, fmt)
    assert detect_checkpoint_quant(json.loads((checkpoint / "config.json").read_text())).scheme == SCHEMES[fmt]
    got = runtime_weights(build_artifact(checkpoint, compile="none"))
    assert not [n for n in got if n.endswith(("qweight", "qzeros", "scales", "g_idx"))]
    for layer in range(3):
        for fused in FUSED:
            for leaf, expected in expected_layer(original, layer, fused, -1 if fmt == "gptq-channel" else 128).items():
                tensor = got[f"model.layers.{layer}.{fused}.{leaf}"]
                assert tensor.dtype == expected.dtype and tensor.shape == expected.shape, (fused, leaf)
                assert torch.equal(tensor, expected), (layer, fused, leaf)
    assert torch.equal(got["lm_head.weight"], original["lm_head.weight"])


def test_gptq_and_awq_of_the_same_values_load_to_the_same_tensors(tiny_dir, tmp_path, build_artifact):
    gptq, awq = (runtime_weights(build_artifact(write_int4(tiny_dir, tmp_path / f, f), compile="none"))
                 for f in ("gptq", "awq"))
    assert sorted(gptq) == sorted(awq)
    assert gptq["model.layers.1.self_attn.qkv_proj.weight"].dtype == torch.uint8
    for name, tensor in gptq.items():
        assert torch.equal(tensor, awq[name]), name


@pytest.mark.parametrize("fmt", ["gptq", "gptq-channel"])
def test_greedy_tokens_equal_the_dequantized_float32_twin(fmt, tiny_dir, tmp_path, build_artifact):
    from atom_aot import LLMEngine, SamplingParams
    from factories import random_prompts
    prompts, params = random_prompts(3, 300, seed=4), SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    int4 = build_artifact(write_int4(tiny_dir, tmp_path / fmt, fmt), compile="none")
    twin = build_artifact(write_int4(tiny_dir, tmp_path / f"{fmt}-dq", "dequantized" if fmt == "gptq" else
                                     "dequantized-channel"), compile="none")
    outs = [[o["token_ids"] for o in LLMEngine(str(art)).generate(prompts, params)] for art in (int4, twin)]
    assert outs[0] == outs[1] and all(len(t) == 10 for t in outs[0])


def test_manifest_and_inspect_name_the_scheme_and_the_gemm(tiny_dir, tmp_path, build_artifact):
    art = Artifact.open(build_artifact(write_int4(tiny_dir, tmp_path / "awq", "awq"), compile="none"))
    q = art.manifest.quantization
    assert (q.weights, q.weights_origin) == ("int4-w4a16", "checkpoint")
    assert q.checkpoint_format == "awq 4-bit (gemm), groups of 128, zero points, W4A16"
    text = describe(art)
    assert "int4-w4a16 (from the checkpoint" in text and "down_proj int4-w4a16" in text
    assert "int4_linear: aten" in text and "atom::int4_linear" in text


class TestRefusals:
    @pytest.mark.parametrize("config,named", [
        (gptq_config(desc_act=True), "desc_act true \\(act-order"),
        (gptq_config(bits=3), "gptq: 3-bit weights"),
        (gptq_config(bits=8), "gptq: 8-bit weights"),
        (gptq_config(64), "group_size 64"),
        (gptq_config(checkpoint_format="marlin"), "checkpoint_format 'marlin'"),
        (gptq_config(lm_head=True), "quantized lm_head"),
        (awq_config(version="gemv"), "awq: version 'gemv'"),
        (awq_config(version="exllama"), "version 'exllama'"),
        (awq_config(bits=8), "awq: 8-bit weights"),
        (awq_config(zero_point=False), "zero_point false"),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}},
         "int4 weights \\(int4 pack-quantized"),
    ])
    def test_unsupported_variants_are_named(self, config, named):
        with pytest.raises(BuildError, match=named) as err:
            detect_checkpoint_quant({"quantization_config": config})
        assert "gptq 4-bit" in str(err.value) and "awq 4-bit" in str(err.value)      # and what is supported

    def test_a_permuted_g_idx_is_refused_as_act_order(self, tiny_dir, tmp_path, build_artifact):
        checkpoint = write_int4(tiny_dir, tmp_path / "perm", "gptq")
        tensors = load_file(str(checkpoint / "model.safetensors"))
        name = "model.layers.1.mlp.down_proj.g_idx"        # K = 256: two groups
        tensors[name] = tensors[name].flip(0).contiguous()
        save_file(tensors, str(checkpoint / "model.safetensors"))
        with pytest.raises(BuildError, match=r"layers.1.mlp.down_proj.g_idx is not k // 128: act-order"):
            build_artifact(checkpoint, compile="none")

    def test_int4_moe_and_tensor_parallel_are_refused(self):
        from atom_aot.weights.int4_checkpoint import check_int4_model
        from atom_aot.models import ModelConfig
        from model_factories import TINY_QWEN3
        with pytest.raises(BuildError, match="int4 .* experts are not loaded yet"):
            check_int4_model(ModelConfig.from_hf_dict({**TINY_QWEN3, "architectures": ["Qwen3MoeForCausalLM"],
                                                       "num_experts": 4, "num_experts_per_tok": 2,
                                                       "moe_intermediate_size": 64}), 1)
        with pytest.raises(BuildError, match="not sharded over tensor-parallel ranks"):
            check_int4_model(ModelConfig.from_hf_dict(TINY_QWEN3), 2)
