"""atom_triton::int4_linear_small_m (the W4A16 GEMM for a few tokens: the weight tiled, split K) against
float64 math on the same int4 values, on fresh random inputs, under TRITON_INTERPRET=1 without a GPU (outputs
NaN-poisoned); and the int4 backend that runs it up to max_m tokens."""
import pytest
import torch

from test_int4_linear import float64_product, rel_err
from test_triton_int4_gemm import TOL, case
from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends import make_backend
from atom_aot.ops.int4 import int4_linear_reference
from atom_aot.ops.triton.int4_small_m import CANDIDATE_CONFIGS, launch_int4_small_m


@pytest.mark.parametrize("group,shape,config", [
    (128, (1, 256, 72), (64, 128, 1, 4, 1)),       # one K step per group, tails in N
    (128, (5, 384, 136), (64, 64, 2, 4, 1)),       # two steps per group, split K over three groups
    (-1, (3, 200, 40), (32, 128, 2, 4, 1)),        # per channel, K off the block size (masked tail)
    (128, (16, 512, 64), (32, 128, 4, 4, 1)),      # a full M tile, four K slices
], ids=["one-step", "split-2", "channel-tail", "split-4"])
def test_matches_float64(group, shape, config):
    m, k, n = shape
    v, x, layer, b, b_cpu = case(n, k, group, m, seed=21 + m, bias=True)
    y = launch_int4_small_m(x, *layer, b, *config)
    assert y.shape == (m, n) and not torch.isnan(y).any()
    assert rel_err(y.cpu(), float64_product(x.cpu(), v, b_cpu)) < TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [128, -1])
def test_half_activations_take_the_zero_point_off_after_the_dot(dtype, group):
    """bf16 / fp16 x: the widened weight is BIAS + q (128 or 1024) and BIAS + z comes off the sums: within the
    output dtype's rounding of the float64 product, as the reference op."""
    v, x, layer, _, _ = case(96, 256, group, 7, seed=22)
    x = x.to(dtype)
    y = torch.ops.atom_triton.int4_linear_small_m(x, *layer, None, 32, 128, 2, 4, 1)
    assert y.dtype == dtype
    ref = int4_linear_reference(x.cpu(), *[t.cpu() for t in layer], None)
    assert rel_err(y.cpu(), float64_product(x.cpu(), v)) < 1e-2 and rel_err(y.cpu(), ref) < 1e-2


@pytest.mark.parametrize("config", CANDIDATE_CONFIGS[:3], ids=str)
def test_candidate_configs_are_correct(config):
    """The build times these; each must compute the same product."""
    v, x, layer, _, _ = case(136, 256, 128, 3, seed=23)
    y = launch_int4_small_m(x, *layer, None, *config)
    assert rel_err(y.cpu(), float64_product(x.cpu(), v)) < TOL


@pytest.mark.parametrize("k,split_k", [(256, 4), (384, 2)], ids=["empty-slices", "last-slice-past-k"])
def test_steps_past_k_read_no_scale(k, split_k):
    """Slices rounded up to whole BLOCK_K steps reach past K (256 in four slices of 128: two empty ones; 384 in
    two of 256: a last step at 384). Such a step has no group: with NaN lying just past the scales, the product
    stays exact (reading them gave NaN in the last row, now and then, wherever the memory there held one)."""
    v, x, (weight, scale, zero), _, _ = case(72, k, 128, 3, seed=25)
    room = torch.full((scale.numel() + 64,), float("nan"), device=scale.device)
    room[:scale.numel()] = scale.flatten()
    y = launch_int4_small_m(x, weight, room[:scale.numel()].view(scale.shape), zero, None, 64, 128, split_k, 4, 1)
    assert not torch.isnan(y).any()
    assert rel_err(y.cpu(), float64_product(x.cpu(), v)) < TOL


def test_block_k_must_divide_the_group():
    _, x, layer, _, _ = case(16, 256, 128, 2, seed=24)
    with pytest.raises(ValueError, match="must divide the group size 128"):
        launch_int4_small_m(x, *layer, None, 64, 256, 1, 4, 1)


@pytest.mark.parametrize("m", [1, 4, 5])
def test_backend_picks_the_kernel_by_token_count(m, monkeypatch):
    """small_m+aten: the small-M kernel up to max_m (4 here), `aten` above (on the CPU the reference op);
    both equal the float64 product."""
    gemm = make_backend("int4_linear", BackendChoice("small_m+aten", {"int4_small_m": (4, 32, 128, 2, 4, 1)}))
    v, x, layer, b, b_cpu = case(40, 256, 128, m, seed=70 + m, bias=True)
    calls = []
    op = torch.ops.atom_triton.int4_linear_small_m
    monkeypatch.setattr(torch.ops.atom_triton, "int4_linear_small_m", lambda *a: calls.append(m) or op(*a))
    y = gemm(x, *layer, b)
    assert calls == ([m] if m <= 4 else [])
    assert rel_err(y.cpu(), float64_product(x.cpu(), v, b_cpu)) < TOL


def test_backend_with_the_triton_gemm_above_needs_its_params():
    gemm = make_backend("int4_linear", BackendChoice("small_m+triton", {"int4_small_m": (4, 32, 128, 2, 4, 1),
                                                                        "int4_gemm": (16, 32, 64, 4, 1)}))
    v, x, layer, _, _ = case(40, 256, 128, 6, seed=80)
    assert rel_err(gemm(x, *layer, None).cpu(), float64_product(x.cpu(), v)) < TOL
    from atom_aot.errors import ArtifactError
    with pytest.raises(ArtifactError, match="int4_gemm"):
        make_backend("int4_linear", BackendChoice("small_m+triton", {"int4_small_m": (4, 32, 128, 2, 4, 1)}))


@pytest.mark.skipif(DEVICE != "cuda", reason="AOTInductor compiles the kernels for a GPU (the interpreter cannot be traced)")
@pytest.mark.parametrize("large", ["aten", "triton"])
def test_compiled_package_branches_on_the_symbolic_token_count(large, tmp_path):
    """As the fp8 small-M test: torch.export with a dynamic M keeps both GEMMs under torch.cond, AOTInductor
    compiles both, and the package gives the float64 product on both sides of max_m (16)."""
    from torch.export import Dim

    from atom_aot.build.export import compile_package

    v, x, layer, b, _ = case(48, 256, 128, 40, seed=90, bias=True)
    x, b = x.bfloat16(), b.bfloat16()
    params = {"int4_small_m": (16, 32, 128, 2, 4, 1), **({"int4_gemm": (16, 32, 64, 4, 1)} if large == "triton" else {})}
    gemm = make_backend("int4_linear", BackendChoice(f"small_m+{large}", params))

    class Linear(torch.nn.Module):
        def forward(self, x, weight, weight_scale, weight_zero, bias):
            return gemm(x, weight, weight_scale, weight_zero, bias)

    ep = torch.export.export(Linear(), (x[:5], *layer, b),
                             dynamic_shapes={"x": {0: Dim("m", min=1, max=64)}, "weight": None, "weight_scale": None,
                                             "weight_zero": None, "bias": None})
    assert "cond" in str(ep.graph)
    package = compile_package(ep, tmp_path / "linear.pt2")
    loader = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", True, 1, 0)
    for m in (1, 16, 17, 40):
        y = loader.run([x[:m], *layer, b])[0]
        assert rel_err(y.cpu(), float64_product(x[:m].cpu(), v, b.cpu())) < 1e-2
