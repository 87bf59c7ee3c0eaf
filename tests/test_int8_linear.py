"""INT8 W8A8 linear layers against float64 references on fresh random inputs.

The reference (the op's CPU body) sums int8 x int8 products exactly; torch._int_mm (the CUDA
path's GEMM, which also runs on the CPU in torch 2.13) sums them in int32, exactly too: so the two
agree bit for bit, and both agree with float64 math on the same int8 values up to float32 scaling.
"""
import pytest
import torch

from atom_aot.ops.int8 import (INT8_MAX, check_int_mm_shapes, int8_linear, int8_linear_int_mm,
                               quantize_activations_int8, quantize_weight_int8)

LAYOUTS = ("per-token", "static")


def make_case(layout: str, m: int, k: int, n: int, seed: int, bias: bool = False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * (1 + 4 * torch.rand(m, 1, generator=g))   # rows of different ranges
    w = torch.randn(n, k, generator=g) / k ** 0.5
    weight, weight_scale = quantize_weight_int8(w)
    input_scale = (x.abs().amax() / INT8_MAX).reshape(1) if layout == "static" else None
    b = torch.randn(n, generator=g) if bias else None
    return x, w, weight, weight_scale, input_scale, b


def float64_on_quantized(x, weight, weight_scale, input_scale, bias):
    """The product of the dequantized int8 operands, in float64, quantized independently of the op."""
    x64 = x.double()
    if input_scale is None:
        x_scale = (x64.abs().amax(-1, keepdim=True) / 127).clamp(min=1e-12)
    else:
        x_scale = input_scale.double().reshape(1, 1)
    xq = torch.round(x64 / x_scale).clamp(-128, 127)
    y = (xq * x_scale) @ (weight.double() * weight_scale.double()[:, None]).T
    return y if bias is None else y + bias.double()


def rel_err(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("layout", LAYOUTS)
class TestReference:
    def test_matches_float64_on_the_same_int8_values(self, layout):
        x, _, weight, weight_scale, input_scale, b = make_case(layout, 9, 256, 136, seed=1, bias=True)
        y = int8_linear(x, weight, weight_scale, input_scale, b)
        assert y.shape == (9, 136) and y.dtype == torch.float32
        assert rel_err(y, float64_on_quantized(x, weight, weight_scale, input_scale, b)) < 1e-6

    def test_close_to_the_unquantized_product(self, layout):
        x, w, weight, weight_scale, input_scale, _ = make_case(layout, 16, 384, 256, seed=2)
        err = rel_err(int8_linear(x, weight, weight_scale, input_scale, None), x.double() @ w.double().T)
        assert err < (0.02 if layout == "per-token" else 0.05), err

    def test_bf16_activations_give_bf16(self, layout):
        x, _, weight, weight_scale, input_scale, _ = make_case(layout, 4, 128, 128, seed=3)
        y = int8_linear(x.bfloat16(), weight, weight_scale, input_scale, None)
        assert y.dtype == torch.bfloat16
        assert rel_err(y, float64_on_quantized(x.bfloat16(), weight, weight_scale, input_scale, None)) < 1e-2

    @pytest.mark.parametrize("m", [1, 7, 16, 17, 40])
    def test_int_mm_path_equals_the_reference_bit_for_bit(self, layout, m):
        """The CUDA body (rows padded by 16, torch._int_mm, int32 sums) on the CPU: the same numbers."""
        x, _, weight, weight_scale, input_scale, b = make_case(layout, m, 96, 48, seed=4 + m, bias=True)
        expected = int8_linear(x, weight, weight_scale, input_scale, b)
        assert torch.equal(int8_linear_int_mm(x, weight, weight_scale, input_scale, b), expected)


def test_the_sum_of_products_is_exact_where_float32_sums_are_not():
    """Unit scales make the output the raw sum: with K = 4096 the sums pass 2^24, where float32
    accumulation rounds; both paths must give the int64 sum."""
    g = torch.Generator().manual_seed(9)
    k = 4096
    xq = torch.randint(90, 128, (8, k), generator=g, dtype=torch.int64)
    xq[:, 0] = 127                                                      # amax 127 -> the token scale is 1.0
    wq = torch.randint(90, 128, (16, k), generator=g, dtype=torch.int64)
    exact = xq @ wq.T                                                   # > 2^25, odd values among them
    assert exact.max() > 2 ** 25 and (exact % 2 == 1).any()
    x, weight, ones = xq.float(), wq.to(torch.int8), torch.ones(16)
    for y in (int8_linear(x, weight, ones, None, None), int8_linear_int_mm(x, weight, ones, None, None)):
        assert torch.equal(y, exact.float())
    assert not torch.equal(xq.float() @ wq.float().T, exact.float())   # the float32 GEMM would round


class TestQuantizers:
    def test_weight_is_symmetric_per_channel(self):
        w = torch.randn(24, 64, generator=torch.Generator().manual_seed(5)) * torch.rand(24, 1) * 3
        q, scale = quantize_weight_int8(w)
        assert q.dtype == torch.int8 and scale.shape == (24,) and scale.dtype == torch.float32
        torch.testing.assert_close(scale, w.abs().amax(1) / 127)
        assert q.abs().amax(1).eq(127).all()                            # each row reaches the range's end
        assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all()

    def test_static_activations_saturate_at_the_int8_range(self):
        x = torch.tensor([[0.5, -5.0, 3.97, 1000.0, -1000.0]])
        q, scale = quantize_activations_int8(x, torch.tensor([0.03125]))
        assert q.tolist() == [[16, -128, 127, 127, -128]] and scale.tolist() == [[0.03125]]

    def test_rounding_is_half_to_even(self):
        q, _ = quantize_activations_int8(torch.tensor([[0.5, 1.5, -2.5, 127.0]]), None)
        assert q.tolist() == [[0, 2, -2, 127]]


def test_shapes_cublas_cannot_run_are_refused_by_name():
    weight, _ = quantize_weight_int8(torch.randn(20, 64))
    with pytest.raises(ValueError, match=r"N=20, K=64.*multiples of 8"):
        check_int_mm_shapes(weight)


def test_the_module_runs_the_op_and_its_scheme_fixes_the_parameters():
    from atom_aot.models.quant_layers import Int8Linear
    x, _, weight, weight_scale, input_scale, _ = make_case("static", 5, 64, 32, seed=6)
    layer = Int8Linear(64, 32, False, torch.float32, "int8-static")
    assert layer.weight.dtype == torch.int8 and layer.input_scale.shape == (1,)
    layer.load_state_dict({"weight": weight, "weight_scale": weight_scale, "input_scale": input_scale}, assign=True)
    assert torch.equal(layer(x), int8_linear(x, weight, weight_scale, input_scale, None))
    with pytest.raises(ValueError, match="unknown int8 scheme 'int4'"):
        Int8Linear(64, 32, False, torch.float32, "int4")
