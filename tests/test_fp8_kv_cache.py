"""The fp8 KV cache with per-layer (k, v) scales on the reference path (atom_aot/ops/attention.py),
against float64 attention on fresh random inputs; and the build's calibration and checkpoint scales."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from atom_aot.artifact.reader import Artifact
from atom_aot.ops.attention import paged_attention, reference_attention, to_cache, write_kv_cache
from atom_aot.ops.fp8 import FP8_MAX
from atom_aot.ops.triton.batch_inputs import make_paged_batch

FP8 = torch.float8_e4m3fn
QUERY_LENS = [9, 17, 4]


def rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def prefill_case(magnitude: float, seed: int):
    """Three prompts written into an empty cache this step: (q, k, v, batch) with k, v of the given size."""
    g = torch.Generator().manual_seed(seed)
    batch = make_paged_batch([0, 0, 0], QUERY_LENS, 2, 64, dtype=FP8, generator=g)
    t = sum(QUERY_LENS)
    q = torch.randn(t, 4, 64, generator=g)
    k, v = (magnitude * torch.randn(t, 2, 64, generator=g) for _ in range(2))
    return q, k, v, batch


def attend(q, k, v, batch, cache_dtype, kv_scale):
    cache = torch.zeros(batch.kv_cache.shape, dtype=cache_dtype)
    out = paged_attention(q, k, v, cache, 1, batch.slot_mapping, batch.block_tables, batch.seq_lens,
                          batch.query_start_loc, 64 ** -0.5, kv_scale)
    return out, cache


@pytest.mark.parametrize("magnitude", [1e-3, 1.0, 300.0])
def test_scaled_fp8_cache_is_close_to_float64_at_any_magnitude(magnitude):
    q, k, v, batch = prefill_case(magnitude, seed=int(magnitude * 7) + 1)
    kv_scale = torch.stack([k.abs().amax(), v.abs().amax()]) / FP8_MAX
    out, cache = attend(q, k, v, batch, FP8, kv_scale)
    exact, _ = attend(q.double(), k.double(), v.double(), batch, torch.float64, None)
    assert rel_err(out, exact) < 0.05
    # unscaled, large values leave e4m3's range and small ones fall into its subnormals
    if magnitude != 1.0:
        unscaled, _ = attend(q, k, v, batch, FP8, None)
        assert torch.isnan(unscaled).any() or rel_err(unscaled, exact) > 3 * rel_err(out, exact)


def test_cache_holds_quantized_rows_and_reads_dequantize_them():
    q, k, v, batch = prefill_case(20.0, seed=3)
    kv_scale = torch.tensor([0.07, 0.02])
    out, cache = attend(q, k, v, batch, FP8, kv_scale)
    flat = cache[1].view(2, -1, 2, 64)
    slots = batch.slot_mapping
    assert torch.equal(flat[0, slots].view(torch.uint8), to_cache(k, FP8, kv_scale[0]).view(torch.uint8))
    assert torch.equal(flat[1, slots].view(torch.uint8), to_cache(v, FP8, kv_scale[1]).view(torch.uint8))
    # attention over the stored values times their scales, in float64
    expected = reference_attention(q.double(), cache[1].double() * kv_scale.double()[:, None, None, None, None],
                                   batch.block_tables, batch.seq_lens, batch.query_start_loc, 64 ** -0.5)
    assert rel_err(out, expected) < 1e-6


def test_write_without_scales_keeps_the_model_dtype_path():
    q, k, v, batch = prefill_case(1.0, seed=4)
    cache = torch.zeros(batch.kv_cache.shape[1:], dtype=torch.float32)
    write_kv_cache(cache, k, v, batch.slot_mapping)
    assert torch.equal(cache.view(2, -1, 2, 64)[0, batch.slot_mapping], k)


class TestBuild:
    def test_fp8_cache_scales_are_calibrated_at_build(self, tiny_llama_dir, build_artifact):
        art = Artifact.open(build_artifact(tiny_llama_dir, compile="none", kv_cache_dtype="fp8"))
        assert (art.manifest.kv_cache.dtype, art.manifest.kv_cache.scales) == ("float8_e4m3fn", "calibrated")
        weights = load_file(str(art.member_path(art.manifest.layout.weights_member(0))))
        scales = torch.stack([weights[f"model.layers.{i}.self_attn.kv_scale"] for i in range(3)])   # [L, 2]
        assert (scales > 0).all() and not torch.allclose(scales, torch.ones_like(scales))

    def test_calibrated_scales_are_the_amax_of_what_the_cache_receives(self, tiny_llama_dir):
        """amax(|k|), amax(|v|) / 448 per layer, from the keys as written (after rope)."""
        from atom_aot.weights.kv_scales import calibrate_kv_scales, prefill_inputs
        from model_factories import tiny_model
        model = tiny_model(seed=2)
        prompts = [list(range(3, 40)), list(range(10, 22))]
        scales = calibrate_kv_scales(model, prompts)
        inputs = prefill_inputs(model.config, prompts, torch.float32, "cpu")
        with torch.no_grad():
            model(inputs)
        for i in range(model.config.num_hidden_layers):
            amax = inputs.kv_cache[i].abs().flatten(1).amax(1)
            assert torch.allclose(scales[f"model.layers.{i}.self_attn.kv_scale"], amax / FP8_MAX)

    @pytest.mark.parametrize("names", [("self_attn.k_scale", "self_attn.v_scale"),
                                       ("self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale")])
    def test_checkpoint_scales_are_taken_as_they_are(self, tiny_llama_dir, tmp_path, build_artifact, names):
        import shutil
        checkpoint = shutil.copytree(tiny_llama_dir, tmp_path / "with-kv-scales")
        tensors = load_file(str(checkpoint / "model.safetensors"))
        for i in range(3):
            tensors[f"model.layers.{i}.{names[0]}"] = torch.tensor(0.01 * (i + 1))
            tensors[f"model.layers.{i}.{names[1]}"] = torch.tensor(0.5)
        save_file(tensors, str(checkpoint / "model.safetensors"))
        art = Artifact.open(build_artifact(checkpoint, compile="none", kv_cache_dtype="fp8"))
        assert art.manifest.kv_cache.scales == "checkpoint"
        weights = load_file(str(art.member_path(art.manifest.layout.weights_member(0))))
        for i in range(3):
            assert torch.equal(weights[f"model.layers.{i}.self_attn.kv_scale"], torch.tensor([0.01 * (i + 1), 0.5]))
        assert "per-layer k/v scales from the checkpoint" in __import__("atom_aot.runtime.inspect", fromlist=["x"]) \
            .describe(art)
