"""Pre-quantized checkpoints: detected from config.json, loaded as stored into the runtime layout.

A tiny Llama (K multiples of 128, so the block formats apply) is saved in each supported format the
way that format stores it (tests/prequantized_factories.py); each loads to exactly the runtime
tensors its scheme implies, and the per-channel formats to the very tensors `--quant fp8` makes.
"""
import pytest
import torch
from safetensors.torch import load_file

from atom_aot.artifact.reader import Artifact
from atom_aot.errors import BuildError
from atom_aot.ops.fp8 import FP8_MAX, quantize_weight_blocks, quantize_weight_per_channel
from atom_aot.runtime.inspect import describe
from atom_aot.weights.quant_config import detect_checkpoint_quant
from factories import make_tiny_model
from prequantized_factories import FORMATS, INPUT_AMAX, quantize_per_tensor, write_prequantized

SCHEMES = {"fp8-tensor-dynamic": "fp8", "fp8-tensor-static": "fp8-static", "fp8-block": "fp8-block",
           "fbgemm_fp8": "fp8-ub", "ct-channel-dynamic": "fp8", "ct-tensor-static": "fp8-static", "ct-block": "fp8-block"}
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",), "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama-128", hidden_size=128,
                           intermediate_size=256, num_attention_heads=4, num_key_value_heads=4)


def runtime_weights(artifact) -> dict[str, torch.Tensor]:
    art = Artifact.open(artifact)
    return load_file(str(art.member_path(art.manifest.layout.weights_member(0))))


def expected_layer(original: dict, layer: int, fused: str, layout: str, static: bool) -> dict[str, torch.Tensor]:
    """The runtime tensors of one fused linear, from the unquantized checkpoint's parts."""
    parts = [original[f"model.layers.{layer}.{p}.weight"] for p in FUSED[fused]]
    if layout == "block":
        weight, scale = quantize_weight_blocks(torch.cat(parts))
    elif layout == "channel":
        weight, scale = quantize_weight_per_channel(torch.cat(parts))
    else:
        quantized = [quantize_per_tensor(p) for p in parts]
        weight = torch.cat([q for q, _ in quantized])
        scale = torch.cat([s.expand(p.shape[0]) for (_, s), p in zip(quantized, parts)])
    out = {"weight": weight, "weight_scale": scale}
    if static:
        out["input_scale"] = torch.tensor([INPUT_AMAX / FP8_MAX])
    return out


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_format_loads_to_its_runtime_tensors(fmt, tiny_dir, tmp_path, build_artifact):
    checkpoint = write_prequantized(tiny_dir, tmp_path / fmt, fmt)
    _, layout, _, static = FORMATS[fmt]
    assert detect_checkpoint_quant(__import__("json").loads((checkpoint / "config.json").read_text())).scheme \
        == SCHEMES[fmt]
    got = runtime_weights(build_artifact(checkpoint, compile="none"))
    original = load_file(str(next(tiny_dir.glob("*.safetensors"))))
    for layer in range(3):
        for fused in FUSED:
            for leaf, expected in expected_layer(original, layer, fused, layout, static).items():
                tensor = got[f"model.layers.{layer}.{fused}.{leaf}"]
                assert tensor.dtype == expected.dtype and tensor.shape == expected.shape, (fused, leaf)
                assert torch.equal(tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor,
                                   expected.view(torch.uint8) if expected.dtype == torch.float8_e4m3fn else expected)
    assert got["lm_head.weight"].dtype == torch.float32 and torch.equal(got["lm_head.weight"], original["lm_head.weight"])


@pytest.mark.parametrize("fmt", ["fbgemm_fp8", "ct-channel-dynamic"])
def test_per_channel_formats_load_to_what_quant_fp8_makes(fmt, tiny_dir, tmp_path, build_artifact):
    ours = runtime_weights(build_artifact(tiny_dir, compile="none", quant="fp8"))
    theirs = runtime_weights(build_artifact(write_prequantized(tiny_dir, tmp_path / fmt, fmt), compile="none"))
    bounds = {name: theirs.pop(name) for name in list(theirs) if name.endswith(".activation_scale_ub")}
    if fmt == "fbgemm_fp8":     # its config's activation_scale_ub, on each of the 4 linears of the 3 layers
        assert len(bounds) == 12 and all(b.tolist() == [1200.0] for b in bounds.values())
    else:
        assert not bounds
    assert sorted(ours) == sorted(theirs)
    for name, tensor in ours.items():
        other = theirs[name]
        assert torch.equal(tensor.view(torch.uint8), other.view(torch.uint8)) if tensor.dtype.itemsize == 1 \
            else torch.equal(tensor, other), name


def test_manifest_and_inspect_name_the_scheme_and_its_origin(tiny_dir, tmp_path, build_artifact):
    artifact = build_artifact(write_prequantized(tiny_dir, tmp_path / "ct", "ct-tensor-static"), compile="none")
    q = Artifact.open(artifact).manifest.quantization
    assert (q.weights, q.weights_origin, q.ignored) == ("fp8-static", "checkpoint", ("lm_head",))
    assert "compressed-tensors float8, tensor weights, static tensor activations" in q.checkpoint_format
    text = describe(Artifact.open(artifact))
    assert "fp8-static" in text and "from the checkpoint" in text and "lm_head none" in text


def test_fbgemm_activation_scale_ub_is_the_scheme_when_given_and_checked():
    plain = detect_checkpoint_quant({"quantization_config": {"quant_method": "fbgemm_fp8"}})
    assert (plain.scheme, plain.activation_scale_ub) == ("fp8", None)
    bounded = detect_checkpoint_quant({"quantization_config": {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200}})
    assert (bounded.scheme, bounded.activation_scale_ub) == ("fp8-ub", 1200.0)
    assert "activation_scale_ub=1200" in bounded.description
    with pytest.raises(BuildError, match="activation_scale_ub -1"):
        detect_checkpoint_quant({"quantization_config": {"quant_method": "fbgemm_fp8", "activation_scale_ub": -1}})


def test_the_bounded_scale_is_fbgemms_on_rows_beyond_the_bound():
    """fbgemm: scale = min(amax, ub) / 448 per token, x / scale saturated at +-448; against float64."""
    from atom_aot.models.quant_layers import Fp8Linear
    g = torch.Generator().manual_seed(3)
    layer = Fp8Linear(64, 48, False, torch.float32, "fp8-ub")
    w = torch.randn(48, 64, generator=g) / 8
    weight, scale = quantize_weight_per_channel(w)
    ub = 6.0                                                     # above every N(0, 1) row of 64
    layer.load_state_dict({"weight": weight, "weight_scale": scale, "activation_scale_ub": torch.tensor([ub])},
                          assign=True)
    x = torch.randn(6, 64, generator=g)
    x[1, 5], x[3, :4] = 40.0, -25.0                                 # rows 1 and 3 go past the bound
    x64 = x.double()
    token_scale = x64.abs().amax(-1, keepdim=True).clamp(max=ub) / FP8_MAX
    xq = (x64 / token_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).double()
    expected = (xq @ weight.double().T) * token_scale * scale.double()
    torch.testing.assert_close(layer(x).double(), expected, rtol=1e-5, atol=1e-5)
    unbounded = Fp8Linear(64, 48, False, torch.float32, "fp8")
    unbounded.load_state_dict({"weight": weight, "weight_scale": scale}, assign=True)
    assert not torch.allclose(unbounded(x)[[1, 3]], layer(x)[[1, 3]])      # the bound changed those rows
    torch.testing.assert_close(unbounded(x)[[0, 2, 4, 5]], layer(x)[[0, 2, 4, 5]])


class TestRefusals:
    def test_unknown_method_names_itself_and_the_supported_ones(self):
        with pytest.raises(BuildError, match=r"quant_method 'bitsandbytes'.*Supported: fp8"):
            detect_checkpoint_quant({"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}})

    def test_int4_compressed_tensors_is_refused_by_name(self):
        config = {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {
            "weights": {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 128}}}}}
        with pytest.raises(BuildError, match="int4 weights"):
            detect_checkpoint_quant(config)

    def test_other_block_sizes_are_refused(self):
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [64, 64]}
        with pytest.raises(BuildError, match=r"weight_block_size \[64, 64\]"):
            detect_checkpoint_quant({"quantization_config": qc})

    def test_quantizing_a_quantized_checkpoint_again(self, tiny_dir, tmp_path, build_artifact):
        with pytest.raises(BuildError, match="already quantized"):
            build_artifact(write_prequantized(tiny_dir, tmp_path / "b", "fp8-block"), compile="none", quant="fp8")

    def test_a_decoder_linear_left_unquantized_is_named(self, tiny_dir, tmp_path, build_artifact):
        from safetensors.torch import save_file
        checkpoint = write_prequantized(tiny_dir, tmp_path / "c", "ct-channel-dynamic")
        tensors = load_file(str(checkpoint / "model.safetensors"))
        original = load_file(str(next(tiny_dir.glob("*.safetensors"))))
        name = "model.layers.1.mlp.down_proj"
        tensors[f"{name}.weight"] = original[f"{name}.weight"]
        del tensors[f"{name}.weight_scale"]
        save_file(tensors, str(checkpoint / "model.safetensors"))
        with pytest.raises(BuildError, match=r"leaves 1 decoder linears unquantized \(model.layers.1.mlp.down_proj"):
            build_artifact(checkpoint, compile="none")


def test_a_quantized_lm_head_is_dequantized(tiny_dir, tmp_path, build_artifact):
    """lm_head runs in the model dtype: an FP8 lm_head (not on the ignore list) is widened at build."""
    from safetensors.torch import save_file
    checkpoint = write_prequantized(tiny_dir, tmp_path / "q-head", "ct-channel-dynamic")
    tensors = load_file(str(checkpoint / "model.safetensors"))
    original = tensors["lm_head.weight"]
    weight, scale = quantize_weight_per_channel(original)
    tensors.update({"lm_head.weight": weight, "lm_head.weight_scale": scale[:, None]})
    save_file(tensors, str(checkpoint / "model.safetensors"))
    got = runtime_weights(build_artifact(checkpoint, compile="none"))
    assert got["lm_head.weight"].dtype == torch.float32 and "lm_head.weight_scale" not in got
    assert torch.equal(got["lm_head.weight"], weight.float() * scale[:, None])
    assert ((got["lm_head.weight"] - original).norm() / original.norm()) < 0.04


@pytest.mark.parametrize("fmt", ["fbgemm_fp8", "ct-channel-dynamic"])
def test_a_per_channel_moe_checkpoint_loads_its_experts_as_quant_fp8_makes_them(fmt, tmp_path, build_artifact):
    """Each expert's e4m3 weight and row scales, stacked as they stream in, bit for bit what `--quant fp8`
    makes of the unquantized twin (the experts quantized per row either way)."""
    from factories import make_tiny_model
    moe = make_tiny_model(tmp_path / "moe", "Qwen3MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, norm_topk_prob=True)
    ours = runtime_weights(build_artifact(moe, compile="none", quant="fp8"))
    theirs = runtime_weights(build_artifact(write_prequantized(moe, tmp_path / fmt, fmt), compile="none"))
    theirs = {name: t for name, t in theirs.items() if not name.endswith(".activation_scale_ub")}
    assert sorted(ours) == sorted(theirs)
    assert ours["model.layers.0.mlp.experts.w13"].dtype == torch.float8_e4m3fn
    for name, tensor in ours.items():
        other = theirs[name]
        assert torch.equal(tensor.view(torch.uint8), other.view(torch.uint8)) if tensor.dtype.itemsize == 1 \
            else torch.equal(tensor, other), name


def test_a_block_scaled_moe_checkpoint_loads_its_experts_blocks_and_serves(tmp_path, build_artifact):
    """128x128-block fp8 experts (as Qwen3-30B-A3B-FP8 and DeepSeek-V3 ship them): each expert's e4m3
    weight and block scales stacked bit for bit, gate's blocks then up's; the artifact decodes."""
    from factories import make_tiny_model
    from atom_aot.entrypoints.llm import LLMEngine
    from atom_aot.ops.fp8 import quantize_weight_blocks
    from atom_aot.runtime.sampling_params import SamplingParams
    moe = make_tiny_model(tmp_path / "moe", "Qwen3MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=128, hidden_size=128, num_attention_heads=4, num_key_value_heads=4,
                          head_dim=32, norm_topk_prob=True)
    artifact = build_artifact(write_prequantized(moe, tmp_path / "block", "fp8-block"), compile="none")
    got = runtime_weights(artifact)
    original = load_file(str(next(moe.glob("*.safetensors"))))
    expert = "model.layers.1.mlp.experts"
    gate, up = (quantize_weight_blocks(original[f"{expert}.2.{p}.weight"]) for p in ("gate_proj", "up_proj"))
    assert got[f"{expert}.w13"].dtype == torch.float8_e4m3fn and got[f"{expert}.w13_scale"].shape == (4, 2, 1)
    assert torch.equal(got[f"{expert}.w13"][2].view(torch.uint8), torch.cat([gate[0], up[0]]).view(torch.uint8))
    assert torch.equal(got[f"{expert}.w13_scale"][2], torch.cat([gate[1], up[1]]))
    engine = LLMEngine(str(artifact), num_kv_blocks=32, num_threads=1)
    try:
        out = engine.generate([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    finally:
        engine.close()
    assert len(out[0]["token_ids"]) == 4


def test_a_static_fp8_moe_checkpoint_is_refused_by_name(tmp_path, build_artifact):
    from factories import make_tiny_model
    moe = make_tiny_model(tmp_path / "moe", "Qwen3MoeForCausalLM", num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, norm_topk_prob=True)
    with pytest.raises(ValueError, match="stored quantized"):
        build_artifact(write_prequantized(moe, tmp_path / "static", "ct-tensor-static"), compile="none")


def test_a_block_scaled_dense_checkpoint_splits_over_tp_on_block_boundaries(tmp_path, build_artifact):
    """Qwen3-FP8-style 128x128 blocks over -tp 2 (head_dim 128, one KV head replicated on both ranks): each rank's
    q / k / v rows, o_proj columns and MLP width are whole blocks, the block scales split with them; greedy output
    equal to -tp 1's. Heads of 32 rows would cut blocks: refused naming the width."""
    from factories import make_tiny_model
    from atom_aot.entrypoints.llm import LLMEngine
    from atom_aot.errors import BuildError
    from atom_aot.runtime.sampling_params import SamplingParams
    from factories import random_prompts
    model = make_tiny_model(tmp_path / "dense", hidden_size=256, intermediate_size=256, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=128)
    checkpoint = write_prequantized(model, tmp_path / "block", "fp8-block")
    prompts = random_prompts(4, 300, seed=7)

    def greedy(artifact):
        engine = LLMEngine(str(artifact), num_kv_blocks=64, num_threads=1)
        try:
            return [o["token_ids"] for o in engine.generate(prompts, SamplingParams(temperature=0, max_tokens=6,
                                                                                    ignore_eos=True))]
        finally:
            engine.close()
    assert greedy(build_artifact(checkpoint, compile="none", tensor_parallel_size=2)) == \
        greedy(build_artifact(checkpoint, compile="none"))
    narrow = write_prequantized(make_tiny_model(tmp_path / "narrow", hidden_size=128, intermediate_size=256,
                                                num_attention_heads=4, num_key_value_heads=4), tmp_path / "nb", "fp8-block")
    with pytest.raises(BuildError, match="query rows per rank .* is 64"):
        build_artifact(narrow, compile="none", tensor_parallel_size=2)


@pytest.mark.parametrize("arch", ["gfx942", "sm80"])
def test_fp8_for_an_arch_without_e4m3fn_is_refused_by_name(arch, tiny_dir, tmp_path):
    """gfx942 computes in e4m3fnuz and sm80 has no FP8: --quant fp8, an FP8 checkpoint and an FP8 KV cache are
    each refused at plan time naming the arch and what it lacks; bf16 and int8 plan there, and gfx950 / sm90 take
    FP8."""
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.pipeline import plan
    lacks = "e4m3fnuz" if arch == "gfx942" else "sm89"
    checkpoint = write_prequantized(tiny_dir, tmp_path / "fp8-ckpt", "ct-channel-dynamic")
    for model, options, named in ((tiny_dir, {"quant": "fp8"}, "fp8 linears"),
                                  (checkpoint, {}, "fp8 linears"),
                                  (tiny_dir, {"kv_cache_dtype": "fp8"}, "--kv-cache-dtype fp8")):
        with pytest.raises(BuildError, match=f"{named}.*cannot be built for {arch}: .*{lacks}"):
            plan(str(model), BuildConfig(arch=arch, **options))
    for options in ({}, {"quant": "int8"}):
        plan(str(tiny_dir), BuildConfig(arch=arch, **options))
    for fine in ("gfx950", "sm90"):
        plan(str(checkpoint), BuildConfig(arch=fine, kv_cache_dtype="fp8"))
