"""atom_triton::fp8_linear (the Triton FP8 GEMM) against float64 math on the same FP8 operands, on
fresh random inputs, under TRITON_INTERPRET=1 without a GPU (outputs NaN-poisoned)."""
import pytest
import torch

from test_fp8_linear import float64_on_quantized, make_case, rel_err
from triton_support import DEVICE, ON_GPU, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.ops.fp8 import fp8_linear_reference
from atom_aot.ops.triton.fp8_gemm import CANDIDATE_CONFIGS, launch_fp8_linear

TOL = 1e-5 if ON_GPU else 1e-6   # the GPU's fp32 accumulation order differs from float64's


def case_on_device(*args, **kwargs):
    """make_case's tensors (CPU) on the device the kernels run on."""
    return [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in make_case(*args, **kwargs)]


@pytest.mark.parametrize("layout,shape", [("per-token", (5, 160, 72)), ("static", (3, 64, 40)),
                                          ("block", (7, 256, 200))])
def test_each_layout_matches_float64(layout, shape):
    m, k, n = shape
    x, _, weight, weight_scale, input_scale, b = case_on_device(layout, m, k, n, seed=4, bias=True)
    y = launch_fp8_linear(x, weight, weight_scale, input_scale, b, 16, 64, 64, 4, 1)
    assert y.shape == (m, n) and not torch.isnan(y).any()
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, input_scale, b)) < TOL


def test_bf16_activations_match_the_reference_op():
    x, _, weight, weight_scale, _, _ = case_on_device("block", 6, 128, 136, seed=5)
    x = x.bfloat16()
    y = torch.ops.atom_triton.fp8_linear(x, weight, weight_scale, None, None, 16, 32, 128, 4, 1)
    assert y.dtype == torch.bfloat16
    assert rel_err(y, fp8_linear_reference(x, weight, weight_scale, None, None)) < 1e-2   # the op on CUDA is cuBLAS


def config_tolerance(config) -> float:
    """Tiles of 64+ rows run on Hopper's wgmma, whose fp8 products are summed in reduced precision within
    one K step (<= 128 values, then added in fp32: DeepSeek-V3's promotion interval)."""
    return 5e-4 if ON_GPU and config.block_m >= 64 else TOL


@pytest.mark.parametrize("layout", ["block", "per-token"])
@pytest.mark.parametrize("config", CANDIDATE_CONFIGS if ON_GPU else CANDIDATE_CONFIGS[:2], ids=str)
def test_candidate_configs_are_correct(config, layout):
    """The build times these; each must compute the same product (one M tile, tails in N)."""
    x, _, weight, weight_scale, _, _ = case_on_device(layout, 3, 128, 72, seed=6)
    y = launch_fp8_linear(x, weight, weight_scale, None, None, *config.as_args())
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, None, None)) < config_tolerance(config)


@pytest.mark.skipif(not ON_GPU, reason="the reduced-precision accumulation is Hopper's; the interpreter is exact")
@pytest.mark.parametrize("config", CANDIDATE_CONFIGS, ids=str)
def test_long_k_error_does_not_grow_with_k(config):
    """K = 14336 (Llama-3.1-8B's down_proj): each step's product is added in fp32, so the error stays at
    one step's, not 112 steps' worth of reduced-precision sums."""
    x, _, weight, weight_scale, _, _ = case_on_device("per-token", 64, 14336, 256, seed=7)
    y = launch_fp8_linear(x, weight, weight_scale, None, None, *config.as_args())
    assert rel_err(y, float64_on_quantized(x, weight, weight_scale, None, None)) < config_tolerance(config)
