"""FP8 W8A8 linear layers against float64 references on fresh random inputs.

Each layout is checked twice: the op against float64 math on the very FP8 values it computed
with (only float32 summation may differ), and against the unquantized float64 product (FP8's
rounding error, a few percent at most).
(The Triton GEMM: tests/test_triton_fp8_gemm.py.)
"""
import pytest
import torch

from atom_aot.ops.fp8 import (BLOCK, FP8_MAX, dequantize_weight, fp8_linear, quantize_activations,
                              quantize_weight_blocks, quantize_weight_per_channel)

LAYOUTS = ("per-token", "static", "block")


def make_case(layout: str, m: int, k: int, n: int, seed: int, bias: bool = False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * (1 + 4 * torch.rand(m, 1, generator=g))   # rows of different ranges
    w = torch.randn(n, k, generator=g) / k ** 0.5
    quantize = quantize_weight_blocks if layout == "block" else quantize_weight_per_channel
    weight, weight_scale = quantize(w)
    input_scale = (x.abs().amax() / FP8_MAX).reshape(1) if layout == "static" else None
    b = torch.randn(n, generator=g) if bias else None
    return x, w, weight, weight_scale, input_scale, b


def float64_on_quantized(x, weight, weight_scale, input_scale, bias):
    """The product of the dequantized FP8 operands, in float64."""
    xq, x_scale = quantize_activations(x, input_scale, weight_scale.dim() == 2)
    groups = x_scale.shape[1]
    xd = (xq.double().unflatten(1, (groups, -1)) * x_scale.double()[..., None]).flatten(1)
    y = xd @ dequantize_weight(weight, weight_scale).double().T
    return y if bias is None else y + bias.double()


def rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("layout", LAYOUTS)
class TestReference:
    def test_matches_float64_on_the_same_fp8_values(self, layout):
        x, _, weight, weight_scale, input_scale, b = make_case(layout, 9, 256, 136, seed=1, bias=True)
        y = fp8_linear(x, weight, weight_scale, input_scale, b)
        assert y.shape == (9, 136) and y.dtype == torch.float32
        assert rel_err(y, float64_on_quantized(x, weight, weight_scale, input_scale, b)) < 1e-6

    def test_close_to_the_unquantized_product(self, layout):
        x, w, weight, weight_scale, input_scale, _ = make_case(layout, 16, 384, 256, seed=2)
        assert rel_err(fp8_linear(x, weight, weight_scale, input_scale, None), x.double() @ w.double().T) < 0.06

    def test_bf16_activations_give_bf16(self, layout):
        x, _, weight, weight_scale, input_scale, _ = make_case(layout, 4, 128, 128, seed=3)
        y = fp8_linear(x.bfloat16(), weight, weight_scale, input_scale, None)
        assert y.dtype == torch.bfloat16
        assert rel_err(y, float64_on_quantized(x.bfloat16(), weight, weight_scale, input_scale, None)) < 1e-2


class TestQuantizers:
    def test_weight_blocks_roundtrip_within_fp8_precision(self):
        w = torch.randn(200, 256)
        q, scale = quantize_weight_blocks(w)
        assert q.dtype == torch.float8_e4m3fn and scale.shape == (2, 2)
        assert rel_err(dequantize_weight(q, scale), w) < 0.04

    def test_each_block_uses_the_full_range(self):
        w = torch.randn(256, 256)
        w[:BLOCK, :BLOCK] *= 100                  # one loud block must not coarsen the others
        q, scale = quantize_weight_blocks(w)
        amax = q.float().abs().unflatten(0, (2, BLOCK)).unflatten(2, (2, BLOCK)).amax(dim=(1, 3))
        assert torch.allclose(amax, torch.full((2, 2), FP8_MAX))

    def test_activation_groups_are_per_row_and_128_columns(self):
        x = torch.randn(3, 256)
        x[1, 128:] *= 50
        _, scale = quantize_activations(x, None, block_scaled=True)
        assert scale.shape == (3, 2)
        assert torch.allclose(scale, x.abs().unflatten(1, (2, BLOCK)).amax(-1) / FP8_MAX)

    def test_block_layout_refuses_k_off_the_grid(self):
        weight, scale = quantize_weight_per_channel(torch.randn(128, 96))
        with pytest.raises(ValueError, match="multiple of 128"):
            fp8_linear(torch.randn(2, 96), weight, scale[:1, None].expand(1, 1).contiguous(), None, None)



@pytest.mark.parametrize("layout", ["per-token", "static"])
def test_the_inline_scaled_mm_path_matches_float64(layout):
    """What the `aten` backend writes into a CUDA graph (quantize, then torch._scaled_mm with row-wise
    scales), run where this torch has _scaled_mm on the CPU: the same numbers as the reference."""
    from atom_aot.ops.fp8 import fp8_linear_cublas
    x, _, weight, weight_scale, input_scale, b = make_case(layout, 9, 256, 136, seed=5, bias=True)
    try:
        y = fp8_linear_cublas(x, weight, weight_scale, input_scale, b)
    except (RuntimeError, NotImplementedError) as e:      # older torch: _scaled_mm is CUDA-only
        pytest.skip(f"torch._scaled_mm does not run on this CPU build: {e}")
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, input_scale, b)) < 1e-6
