"""atom_triton::scaled_mm_small_m (the swapped, split-K FP8 GEMM for decode's small M) against float64
math on the same FP8 operands, on fresh random inputs, under TRITON_INTERPRET=1 without a GPU
(outputs and split-K partials NaN-poisoned, so a tile or slice left unwritten fails)."""
import pytest
import torch

from test_fp8_linear import float64_on_quantized, make_case, rel_err
from triton_support import DEVICE, ON_GPU, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.ops.fp8 import quantize_activations
from atom_aot.ops.triton.small_m_gemm import CANDIDATE_CONFIGS, k_per_split, launch_small_m_gemm

# the GPU's fp8 MMA sums each K step in reduced precision before adding it in fp32 (the kernel's docstring)
TOL = 5e-4 if ON_GPU else 1e-6


def case_on_device(*args, **kwargs):
    return [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in make_case(*args, **kwargs)]


@pytest.mark.parametrize("layout", ["per-token", "static"])
@pytest.mark.parametrize("split_k", [1, 3])
def test_matches_float64(layout, split_k):
    """M past one 16-row tile, N and K with tails (K 200 is not a multiple of BLOCK_K * split_k)."""
    x, _, weight, weight_scale, input_scale, b = case_on_device(layout, 19, 200, 72, seed=11 + split_k, bias=True)
    xq, x_scale = quantize_activations(x, input_scale, block_scaled=False)
    y = torch.ops.atom_triton.scaled_mm_small_m(xq, x_scale, weight, weight_scale, b, x.dtype,
                                                32, 32, split_k, 4, 1)
    assert y.shape == (19, 72) and not torch.isnan(y).any()
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, input_scale, b)) < TOL


@pytest.mark.parametrize("config", CANDIDATE_CONFIGS, ids=str)
def test_candidate_configs_are_correct(config):
    """The build times these; each must compute the same product (one token, N not a multiple of the tile)."""
    x, _, weight, weight_scale, _, _ = case_on_device("per-token", 1, 512, 136, seed=21)
    xq, x_scale = quantize_activations(x, None, block_scaled=False)
    y = launch_small_m_gemm(xq, x_scale, weight, weight_scale, None, torch.float32, *config)
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, None, None)) < TOL


def test_bf16_output_and_split_bounds():
    x, _, weight, weight_scale, _, _ = case_on_device("per-token", 2, 256, 64, seed=22)
    xq, x_scale = quantize_activations(x.bfloat16(), None, block_scaled=False)
    y = torch.ops.atom_triton.scaled_mm_small_m(xq, x_scale, weight, weight_scale, None, torch.bfloat16,
                                                64, 64, 2, 4, 1)
    assert y.dtype == torch.bfloat16
    assert rel_err(y, float64_on_quantized(x.bfloat16(), weight, weight_scale, None, None)) < 1e-2
    assert k_per_split(14336, 256, 4) == 3584 and k_per_split(200, 32, 3) == 96    # whole BLOCK_K steps


@pytest.mark.parametrize("split_k", [1, 2])
def test_block_scaled_weights_match_float64(split_k):
    """128x128 weight blocks and 1x128 activation groups: each K step scaled by its group's scales (K 384:
    three groups; N 200: a partial block), in the kernel or, split, before the partials are summed."""
    x, _, weight, weight_scale, _, b = case_on_device("block", 5, 384, 200, seed=24, bias=True)
    xq, x_scale = quantize_activations(x, None, block_scaled=True)                # x_scale [5, 3]
    y = launch_small_m_gemm(xq, x_scale, weight, weight_scale, b, torch.float32, 64, 64, split_k, 4, 1)
    assert not torch.isnan(y).any()
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, None, b)) < TOL


def _nan_beyond(t: torch.Tensor) -> torch.Tensor:
    """`t` (contiguous) as a view into a buffer whose elements past it are NaN."""
    room = torch.full((t.numel() + 64,), float("nan"), dtype=t.dtype, device=t.device)
    room[:t.numel()] = t.flatten()
    return room[:t.numel()].view(t.shape)


def test_block_scaled_steps_past_k_read_no_scale():
    """Split K rounds each slice up to whole BLOCK_K steps: K 384 in four slices of 128 leaves the last slice
    past K, a step with no group. With NaN lying just past both scale tensors the product stays exact."""
    x, _, weight, weight_scale, _, _ = case_on_device("block", 5, 384, 200, seed=26)
    xq, x_scale = quantize_activations(x, None, block_scaled=True)
    assert k_per_split(384, 64, 4) * 3 == 384                                       # slice 3 starts at K
    y = launch_small_m_gemm(xq, _nan_beyond(x_scale.contiguous()), weight, _nan_beyond(weight_scale.contiguous()),
                            None, torch.float32, 64, 64, 4, 4, 1)
    assert not torch.isnan(y).any()
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, None, None)) < TOL


def test_block_scaled_weights_need_block_k_dividing_128():
    x, _, weight, weight_scale, _, _ = case_on_device("block", 1, 256, 128, seed=23)
    xq, x_scale = quantize_activations(x, None, block_scaled=True)
    with pytest.raises(ValueError, match="block_k dividing 128"):
        launch_small_m_gemm(xq, x_scale, weight, weight_scale, None, torch.float32, 64, 256, 1, 4, 1)


def small_m_backend(max_m: int, large: str = "triton"):
    from atom_aot.artifact.tuning import BackendChoice
    from atom_aot.ops.backends import make_backend
    params = {"fp8_small_m": (max_m, 32, 64, 2, 4, 1)}
    if large == "triton":
        params["fp8_gemm"] = (16, 32, 64, 4, 1)
    return make_backend("fp8_linear", BackendChoice(f"small_m+{large}", params))


@pytest.mark.parametrize("m", [1, 4, 5, 23])
def test_backend_picks_the_kernel_by_token_count(m, monkeypatch):
    """At and below max_m the small-M kernel runs, above it the large-M GEMM; both equal float64 math."""
    gemm = small_m_backend(max_m=4)
    x, _, weight, weight_scale, _, b = case_on_device("per-token", m, 192, 40, seed=30 + m, bias=True)
    calls = []
    for name in ("scaled_mm_small_m", "fp8_scaled_mm"):
        op = getattr(torch.ops.atom_triton, name)
        monkeypatch.setattr(torch.ops.atom_triton, name, lambda *a, op=op, name=name: calls.append(name) or op(*a))
    y = gemm(x, weight, weight_scale, None, b)
    assert calls == ["scaled_mm_small_m" if m <= 4 else "fp8_scaled_mm"]
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, None, b)) < TOL


@pytest.mark.skipif(not ON_GPU, reason="AOTInductor compiles the kernels for a GPU (the interpreter cannot be traced)")
@pytest.mark.parametrize("large", ["aten", "triton"])
def test_compiled_package_branches_on_the_symbolic_token_count(large, tmp_path):
    """torch.export with a dynamic M keeps both GEMMs under torch.cond and AOTInductor compiles both (as
    the build does: build/export.py compile_package); the package, loaded as the runtime loads it, gives
    the reference's product on both sides of max_m (the scaling before the linear fused with the
    quantization)."""
    from torch.export import Dim

    from atom_aot.build.export import compile_package

    x, _, weight, weight_scale, _, b = case_on_device("per-token", 40, 128, 48, seed=40, bias=True)
    x, b = x.bfloat16(), b.bfloat16()
    gemm = small_m_backend(max_m=16, large=large)

    class Linear(torch.nn.Module):
        def forward(self, x, weight, weight_scale, bias):
            return gemm(x * 2, weight, weight_scale, None, bias)

    ep = torch.export.export(Linear(), (x[:5], weight, weight_scale, b),
                             dynamic_shapes={"x": {0: Dim("m", min=1, max=64)}, "weight": None, "weight_scale": None,
                                             "bias": None})
    assert "cond" in str(ep.graph)
    package = compile_package(ep, tmp_path / "linear.pt2")
    loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", True, 1, 0)
    for m in (1, 16, 17, 40):
        y = loader.run([x[:m], weight, weight_scale, b])[0]
        assert rel_err(y, float64_on_quantized(x[:m] * 2, weight, weight_scale, None, b)) < 1e-2


@pytest.mark.parametrize("m", [2, 9])
def test_backend_with_block_scaled_weights(m):
    """Both sides of max_m on 128x128-block weights (the Triton GEMM above it)."""
    x, _, weight, weight_scale, _, _ = case_on_device("block", m, 256, 136, seed=42 + m)
    y = small_m_backend(max_m=4)(x, weight, weight_scale, None, None)
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, None, None)) < TOL


def test_block_scaled_weights_are_refused_over_aten():
    x, _, weight, weight_scale, _, _ = case_on_device("block", 1, 256, 128, seed=41)
    with pytest.raises(ValueError, match="small_m\\+triton"):
        small_m_backend(max_m=4, large="aten")(x, weight, weight_scale, None, None)


@pytest.mark.parametrize("max_m", [4, 128])
def test_fp8_model_on_the_small_m_backend_matches_the_reference_op(max_m):
    """A tiny FP8 model's prefill (101 tokens) through `small_m+triton` (use_linear_kernels, as a decode
    row sets it): over max_m 4 every linear takes the Triton GEMM, under max_m 128 the small-M kernel;
    both give the logits of the CPU reference op."""
    from model_factories import tiny_model
    from test_fp8_model import fp8_twin, prefill_step

    from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
    from atom_aot.models.quant_layers import use_linear_kernels
    twin = fp8_twin(tiny_model(seed=7), torch.float32)
    with torch.no_grad():
        want = twin(prefill_step(twin, torch.float32))
        use_linear_kernels(twin, PhaseTuning({"fp8_linear": BackendChoice(
            "small_m+triton", {"fp8_small_m": (max_m, 32, 32, 2, 4, 1), "fp8_gemm": (16, 32, 32, 4, 1)})}))
        got = twin(prefill_step(twin, torch.float32))
    assert rel_err(got, want) < 1e-5
