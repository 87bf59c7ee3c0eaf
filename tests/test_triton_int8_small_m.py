"""atom_triton::scaled_mm_small_m (the small-M GEMM on int8 operands, int32 sums) and the int8
`small_m+aten` backend, against float64 math on the same int8 values and against the exact-sum
reference op, under TRITON_INTERPRET=1 without a GPU (outputs and split-K partials NaN-poisoned
where they are floats)."""
import pytest
import torch

from test_int8_linear import float64_on_quantized, make_case, rel_err
from triton_support import DEVICE, ON_GPU, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends import make_backend
from atom_aot.ops.int8 import int8_linear, quantize_activations_int8
from atom_aot.ops.triton.small_m_gemm import CANDIDATE_CONFIGS, launch_small_m_gemm

TOL = 1e-6   # int32 sums are exact; only the float32 scaling rounds


def case_on_device(*args, **kwargs):
    return [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in make_case(*args, **kwargs)]


@pytest.mark.parametrize("layout", ["per-token", "static"])
@pytest.mark.parametrize("split_k", [1, 3])
def test_matches_float64(layout, split_k):
    """M past one 16-row tile, N and K with tails."""
    x, _, weight, weight_scale, input_scale, b = case_on_device(layout, 19, 200, 72, seed=51 + split_k, bias=True)
    xq, x_scale = quantize_activations_int8(x, input_scale)
    y = torch.ops.atom_triton.scaled_mm_small_m(xq, x_scale, weight, weight_scale, b, x.dtype,
                                                32, 32, split_k, 4, 1)
    assert y.shape == (19, 72) and not torch.isnan(y).any()
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, input_scale, b)) < TOL


@pytest.mark.parametrize("config", CANDIDATE_CONFIGS, ids=str)
def test_candidate_configs_are_correct(config):
    x, _, weight, weight_scale, _, _ = case_on_device("per-token", 1, 512, 136, seed=61)
    xq, x_scale = quantize_activations_int8(x, None)
    y = launch_small_m_gemm(xq, x_scale, weight, weight_scale, None, torch.float32, *config)
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, None, None)) < TOL


@pytest.mark.parametrize("split_k", [1, 2])
def test_sums_are_exact_where_float32_sums_are_not(split_k):
    """Unit scales make the output the raw sum: past 2^24 a float32 accumulation (or float32 split-K
    partials) would round; the kernel gives the int64 sum (as float32, its output dtype)."""
    g = torch.Generator().manual_seed(9)
    k = 4096
    xq = torch.randint(90, 128, (3, k), generator=g, dtype=torch.int64)
    wq = torch.randint(90, 128, (40, k), generator=g, dtype=torch.int64)
    exact = xq @ wq.T
    assert exact.max() > 2 ** 25 and (exact % 2 == 1).any()
    y = launch_small_m_gemm(xq.to(torch.int8).to(DEVICE), torch.ones(3, 1, device=DEVICE), wq.to(torch.int8).to(DEVICE),
                            torch.ones(40, device=DEVICE), None, torch.float32, 32, 256, split_k, 4, 1)
    assert torch.equal(y.cpu(), exact.float())


def test_mixed_dtypes_and_block_scales_are_refused():
    x, _, weight, weight_scale, _, _ = case_on_device("per-token", 1, 256, 128, seed=62)
    xq, x_scale = quantize_activations_int8(x, None)
    with pytest.raises(ValueError, match="one dtype"):
        launch_small_m_gemm(xq.to(torch.float8_e4m3fn), x_scale, weight, weight_scale, None, torch.float32,
                            64, 128, 1, 4, 1)
    with pytest.raises(ValueError, match="per-channel"):
        launch_small_m_gemm(xq, x_scale, weight, torch.ones(1, 2, device=DEVICE), None, torch.float32,
                            64, 128, 1, 4, 1)


@pytest.mark.parametrize("m", [1, 4, 5, 23])
def test_backend_picks_the_kernel_by_token_count(m, monkeypatch):
    """Up to max_m the small-M kernel, above it `_int_mm` (padded rows); both equal the reference op."""
    gemm = make_backend("int8_linear", BackendChoice("small_m+aten", {"int8_small_m": (4, 32, 64, 2, 4, 1)}))
    x, _, weight, weight_scale, input_scale, b = case_on_device("static", m, 192, 40, seed=70 + m, bias=True)
    calls = []
    op = torch.ops.atom_triton.scaled_mm_small_m
    monkeypatch.setattr(torch.ops.atom_triton, "scaled_mm_small_m", lambda *a: calls.append(m) or op(*a))
    y = gemm(x, weight, weight_scale, input_scale, b)
    assert calls == ([m] if m <= 4 else [])
    assert rel_err(y.cpu(), int8_linear(x.cpu(), weight.cpu(), weight_scale.cpu(), input_scale.cpu(), b.cpu())) < TOL


@pytest.mark.skipif(ON_GPU, reason="the CPU's int8 model reference; the GPU run is the package test")
def test_int8_model_on_the_small_m_backend_matches_the_reference_op():
    """A tiny INT8 model's prefill (101 tokens) entirely on the small-M kernel (max_m 128) gives the
    reference op's logits."""
    from model_factories import tiny_model
    from test_fp8_model import fp8_twin, prefill_step

    from atom_aot.artifact.tuning import PhaseTuning
    from atom_aot.models.quant_layers import use_linear_kernels
    twin = fp8_twin(tiny_model(seed=7), torch.float32, quant="int8")
    with torch.no_grad():
        want = twin(prefill_step(twin, torch.float32))
        use_linear_kernels(twin, PhaseTuning({"int8_linear": BackendChoice(
            "small_m+aten", {"int8_small_m": (128, 32, 32, 2, 4, 1)})}))
        got = twin(prefill_step(twin, torch.float32))
    assert rel_err(got, want) < 1e-5
