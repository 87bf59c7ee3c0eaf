"""atom_triton::int4_linear (the Triton W4A16 GEMM: nibbles unpacked in registers) against float64 math
on the same int4 values, on fresh random inputs, under TRITON_INTERPRET=1 without a GPU (outputs
NaN-poisoned)."""
import pytest
import torch

from test_int4_linear import float64_product, random_values, rel_err, runtime
from triton_support import DEVICE, ON_GPU, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.ops.int4 import int4_linear_reference
from atom_aot.ops.triton.int4_gemm import CANDIDATE_CONFIGS, launch_int4_linear

TOL = 1e-5 if ON_GPU else 1e-6   # the GPU's fp32 accumulation order differs from float64's


def case(n: int, k: int, group: int, m: int, seed: int, bias: bool = False):
    v = random_values(n, k, group, seed)
    g = torch.Generator().manual_seed(seed + 100)
    x = torch.randn(m, k, generator=g) * (1 + 4 * torch.rand(m, 1, generator=g))
    b = torch.randn(n, generator=g) if bias else None
    on = [t.to(DEVICE) for t in runtime(v)]
    return v, x.to(DEVICE), on, None if b is None else b.to(DEVICE), b


@pytest.mark.parametrize("group,shape", [(128, (5, 256, 72)), (-1, (3, 200, 40)), (128, (17, 384, 136))])
def test_matches_float64(group, shape):
    """Tails in M and N; per channel with K (200) off the block size; three groups of 128."""
    m, k, n = shape
    v, x, layer, b, b_cpu = case(n, k, group, m, seed=11, bias=True)
    y = launch_int4_linear(x, *layer, b, 16, 32, 64, 4, 1)
    assert y.shape == (m, n) and not torch.isnan(y).any()
    assert rel_err(y.cpu(), float64_product(x.cpu(), v, b_cpu)) < TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_activations_match_the_reference_op(dtype):
    """The widened weight is BIAS + q (128 in bf16, 1024 in fp16) and BIAS + z comes off each K step's sums."""
    v, x, layer, _, _ = case(64, 256, 128, 6, seed=12)
    x = x.to(dtype)
    y = torch.ops.atom_triton.int4_linear(x, *layer, None, 16, 32, 128, 4, 1)
    assert y.dtype == dtype
    ref = int4_linear_reference(x.cpu(), *runtime(v), None)
    assert rel_err(y.cpu(), ref) < 1e-2 and rel_err(y.cpu(), float64_product(x.cpu(), v)) < 1e-2


@pytest.mark.parametrize("config", CANDIDATE_CONFIGS[:2], ids=str)
def test_candidate_configs_are_correct(config):
    """The build times these; each must compute the same product (one M tile, tails in N)."""
    v, x, layer, _, _ = case(72, 256, 128, 3, seed=13)
    y = launch_int4_linear(x, *layer, None, *config.as_args())
    assert rel_err(y.cpu(), float64_product(x.cpu(), v)) < TOL


def test_block_k_must_divide_the_group():
    _, x, layer, _, _ = case(16, 256, 128, 2, seed=14)
    with pytest.raises(ValueError, match="must divide the group size 128"):
        launch_int4_linear(x, *layer, None, 16, 32, 256, 4, 1)
