"""compressed-tensors W8A8 int8 checkpoints: detected from config.json, loaded as stored.

The tiny Llama is saved as each int8 format the way llm-compressor stores it (tests/int8_factories.py);
each loads to exactly the runtime tensors its scheme implies, the per-channel one to the very
tensors `atom-build --quant int8` makes; unsupported int8 variants are refused by name.
"""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from atom_aot.artifact.reader import Artifact
from atom_aot.errors import BuildError
from atom_aot.ops.int8 import quantize_weight_int8
from atom_aot.runtime.inspect import describe
from atom_aot.weights.quant_config import detect_checkpoint_quant
from factories import make_tiny_model
from int8_factories import (FORMATS, SCHEMES, STATIC_INPUT_SCALE, int8_config, quantize_int8_per_tensor,
                            write_int8)
from test_prequantized import FUSED, runtime_weights


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama-int8", hidden_size=128,
                           intermediate_size=256, num_attention_heads=4, num_key_value_heads=4)


def expected_layer(original: dict, layer: int, fused: str, fmt: str) -> dict[str, torch.Tensor]:
    """The runtime tensors of one fused linear, from the unquantized checkpoint's parts."""
    linears = [p.split(".")[-1] for p in FUSED[fused]]
    parts = [original[f"model.layers.{layer}.{p}.weight"] for p in FUSED[fused]]
    if FORMATS[fmt][0] == "channel":
        weight, scale = quantize_weight_int8(torch.cat(parts))
        return {"weight": weight, "weight_scale": scale}
    quantized = [quantize_int8_per_tensor(p) for p in parts]
    return {"weight": torch.cat([q for q, _ in quantized]),
            "weight_scale": torch.cat([s.expand(p.shape[0]) for (_, s), p in zip(quantized, parts)]),
            "input_scale": torch.tensor([max(STATIC_INPUT_SCALE[n] for n in linears)])}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_int8_format_loads_to_its_runtime_tensors(fmt, tiny_dir, tmp_path, build_artifact):
    checkpoint = write_int8(tiny_dir, tmp_path / fmt, fmt)
    assert detect_checkpoint_quant(json.loads((checkpoint / "config.json").read_text())).scheme == SCHEMES[fmt]
    got = runtime_weights(build_artifact(checkpoint, compile="none"))
    original = load_file(str(next(tiny_dir.glob("*.safetensors"))))
    assert not [n for n in got if "zero_point" in n]
    for layer in range(3):
        for fused in FUSED:
            for leaf, expected in expected_layer(original, layer, fused, fmt).items():
                tensor = got[f"model.layers.{layer}.{fused}.{leaf}"]
                assert tensor.dtype == expected.dtype and tensor.shape == expected.shape, (fused, leaf)
                assert torch.equal(tensor, expected), (layer, fused, leaf)
    assert torch.equal(got["lm_head.weight"], original["lm_head.weight"])


def test_the_channel_checkpoint_loads_to_what_quant_int8_makes(tiny_dir, tmp_path, build_artifact):
    ours = runtime_weights(build_artifact(tiny_dir, compile="none", quant="int8"))
    theirs = runtime_weights(build_artifact(write_int8(tiny_dir, tmp_path / "ct", "ct-int8-channel-dynamic"),
                                            compile="none"))
    assert sorted(ours) == sorted(theirs)
    assert ours["model.layers.0.mlp.down_proj.weight"].dtype == torch.int8
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def test_both_generate_the_same_tokens_end_to_end(tiny_dir, tmp_path, build_artifact):
    """The runtime loads and runs the int8 artifacts (eager); identical tensors, identical tokens."""
    from atom_aot import LLMEngine, SamplingParams
    from factories import random_prompts
    prompts, params = random_prompts(3, 300, seed=4), SamplingParams(temperature=0, max_tokens=8)
    checkpoint = write_int8(tiny_dir, tmp_path / "ct", "ct-int8-channel-dynamic")
    outs = [[o["token_ids"] for o in LLMEngine(str(art)).generate(prompts, params)]
            for art in (build_artifact(tiny_dir, compile="none", quant="int8"), build_artifact(checkpoint, compile="none"))]
    assert outs[0] == outs[1] and all(len(t) == 8 for t in outs[0])


def test_manifest_and_inspect_name_the_scheme_its_origin_and_the_gemm(tiny_dir, tmp_path, build_artifact):
    art = Artifact.open(build_artifact(write_int8(tiny_dir, tmp_path / "s", "ct-int8-tensor-static"), compile="none"))
    q = art.manifest.quantization
    assert (q.weights, q.weights_origin, q.ignored) == ("int8-static", "checkpoint", ("lm_head",))
    assert q.checkpoint_format == "compressed-tensors int8, tensor weights, static tensor activations"
    text = describe(art)
    assert "int8-static (from the checkpoint" in text and "down_proj int8-static" in text
    assert "int8_linear: aten" in text and "atom::int8_linear" in text
    built = describe(Artifact.open(build_artifact(tiny_dir, compile="none", quant="int8")))
    assert "int8 (quantized by atom-build --quant int8)" in built


def test_a_manifest_whose_scheme_disagrees_with_quant_int8_is_refused(tiny_dir, build_artifact):
    from atom_aot.artifact.manifest import Manifest
    from atom_aot.errors import ArtifactError
    d = json.loads(Artifact.open(build_artifact(tiny_dir, compile="none", quant="int8")).manifest.to_json())
    assert Manifest.from_json(json.dumps(d).encode()).quantization.weights == "int8"
    d["quantization"]["weights"] = "fp8"
    with pytest.raises(ArtifactError, match=r"quantization\.weights disagrees"):
        Manifest.from_json(json.dumps(d).encode())


class TestRefusals:
    @pytest.mark.parametrize("config,named", [
        (int8_config(weight_fields={"symmetric": False}), "asymmetric int8 weights"),
        (int8_config(activation_fields={"symmetric": False}), "asymmetric int8 activations"),
        (int8_config(weight_fields={"num_bits": 4}), "int4 weights"),
        (int8_config("group", weight_fields={"group_size": 128}), "int8 group weights \\(group size 128\\)"),
        (int8_config(weight_only=True), "weight-only W8A16"),
        (int8_config(activation_fields={"strategy": "group"}), "dynamic group int8 activations"),
        (int8_config(static=True, activation_fields={"strategy": "token"}), "static token int8 activations"),
        (int8_config(format="pack-quantized"), "stored as 'pack-quantized'"),
    ])
    def test_unsupported_int8_variants_are_named(self, config, named):
        with pytest.raises(BuildError, match=named) as err:
            detect_checkpoint_quant({"quantization_config": config})
        assert "compressed-tensors int8 W8A8" in str(err.value)      # and what is supported

    def test_a_nonzero_zero_point_is_refused_at_build(self, tiny_dir, tmp_path, build_artifact):
        checkpoint = write_int8(tiny_dir, tmp_path / "zp", "ct-int8-tensor-static")
        tensors = load_file(str(checkpoint / "model.safetensors"))
        tensors["model.layers.2.mlp.up_proj.weight_zero_point"] = torch.tensor([3], dtype=torch.int8)
        save_file(tensors, str(checkpoint / "model.safetensors"))
        with pytest.raises(BuildError, match=r"layers.2.mlp.up_proj.weight_zero_point is nonzero"):
            build_artifact(checkpoint, compile="none")

    def test_quant_int8_on_a_quantized_checkpoint(self, tiny_dir, tmp_path, build_artifact):
        with pytest.raises(BuildError, match="already quantized"):
            build_artifact(write_int8(tiny_dir, tmp_path / "q", "ct-int8-channel-dynamic"), compile="none",
                           quant="int8")
