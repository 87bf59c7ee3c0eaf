"""atom_triton::fused_moe on mxfp4 experts (packed e2m1 + e8m0 scales widened in registers) against the reference
op, under TRITON_INTERPRET=1 without a GPU, every buffer the op allocates NaN-poisoned: the widened tile exact for
every code at every exponent, several token-count buckets, top-k > 1, experts without tokens, masked ids, biases;
the `triton` backend in a model-independent MoE layer; the build's tuning on mxfp4 experts."""
import itertools
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from mxfp4_checks import MOE_CONFIG, every_code_at_every_exponent, mxfp4_problem, random_experts
from triton_kernel_checks import rel_error
from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.models import ModelConfig
from atom_aot.ops.backends import make_backend
from atom_aot.ops.moe import fused_moe_reference
from atom_aot.ops.mxfp4 import dequantize_mxfp4
from atom_aot.ops.triton import fused_moe as triton_moe
from atom_aot.ops.triton.mxfp4_tiles import mxfp4_tile

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
# three buckets: T = 1-3 (BLOCK_M 16, K step 32), 4-15 (32 rows, K 64, GROUP_M 2), 16+ (16 rows, N 32, K 64)
TABLE = [1, 16, 16, 32, 1, 2, 1, 4, 32, 16, 64, 2, 4, 1, 16, 16, 32, 64, 1, 4, 1]
STACKS = ("w13", "w2", "w13_scale", "w2_scale", "w13_bias", "w2_bias")


@triton.jit
def widen_kernel(w_ptr, s_ptr, out_ptr, N, K, FLOAT32: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """out [N, K] = the widened tiles of an mxfp4 [N, K] weight, BLOCK_N rows per program."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = rows < N
    for k0 in range(0, K, BLOCK_K):
        tile = mxfp4_tile(w_ptr, s_ptr, rows, ok, k0, K, K // 2, K // 32, FLOAT32, BLOCK_K, BLOCK_N)   # [BK, BN]
        ks = k0 + tl.arange(0, BLOCK_K)
        tl.store(out_ptr + rows[None, :] * K + ks[:, None], tile, mask=ok[None, :] & (ks < K)[:, None])


@pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")   # e >= 253: inf, as meant
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_widened_tile_is_exact_for_every_code_at_every_exponent(dtype):
    """Rows of the 16 codes twice over with exponents e and 255 - e (two scale groups a K step): the tile equals
    the reference dequantization bit for bit, subnormals (e = 0) and NaN (e = 255) included."""
    blocks, scales = every_code_at_every_exponent()
    blocks, scales = torch.cat([blocks, blocks.flip(1)], 1), torch.cat([scales, 255 - scales], 1)   # K = 64
    out = torch.full((256, 64), float("nan"), dtype=dtype, device=DEVICE)
    widen_kernel[(256 // 32,)](blocks.to(DEVICE), scales.to(DEVICE), out, 256, 64, FLOAT32=dtype == torch.float32,
                               BLOCK_K=64, BLOCK_N=32)
    expected = dequantize_mxfp4(blocks, scales, dtype)
    assert torch.equal(out.cpu().isnan(), expected.isnan())
    assert torch.equal(out.cpu()[~expected.isnan()], expected[~expected.isnan()])


def run_both(x, stacks, weights, ids, table=TABLE, dtype=torch.float32):
    args = [stacks.get(name) for name in STACKS]
    reference = fused_moe_reference(x.to(dtype), *args[:2], weights, ids, *args[2:])
    on = [None if t is None else t.to(DEVICE) for t in args]
    got = torch.ops.atom_triton.fused_moe(x.to(DEVICE, dtype), *on[:2], weights.to(DEVICE), ids.to(DEVICE), table,
                                          *on[2:])
    assert got.dtype == dtype and got.shape == x.shape
    return got.cpu(), reference


class TestFusedMoEMxfp4:
    @pytest.mark.parametrize("tokens,experts,top_k,biases", [(1, 4, 2, False), (3, 6, 3, True), (5, 5, 2, True),
                                                              (17, 4, 2, False), (40, 8, 4, True)])
    def test_matches_the_reference_in_every_bucket(self, tokens, experts, top_k, biases):
        got, reference = run_both(*mxfp4_problem(tokens, experts, top_k, seed=tokens, biases=biases))
        assert rel_error(got, reference) < TOL[torch.float32]

    def test_experts_without_tokens_and_masked_ids(self):
        starve = torch.zeros(6)
        starve[[0, 5]] = -1e4
        x, stacks, weights, ids = mxfp4_problem(9, 6, 2, seed=1, router_bias=starve, biases=True)
        assert not set(ids.flatten().tolist()) & {0, 5}
        got, reference = run_both(x, stacks, weights, torch.where(ids % 4 == 1, -1, ids))
        assert rel_error(got, reference) < TOL[torch.float32]

    def test_one_token_routed_to_every_expert(self):
        got, reference = run_both(*mxfp4_problem(1, 4, 4, seed=2, biases=True))
        assert rel_error(got, reference) < TOL[torch.float32]

    def test_bf16(self):
        got, reference = run_both(*mxfp4_problem(12, 4, 2, seed=3, biases=True), dtype=torch.bfloat16)
        assert rel_error(got, reference) < TOL[torch.bfloat16]

    def test_an_uneven_k_tail(self):
        """H = 96 and I = 160 with K steps of 64: the last step half out of range (masked bytes and scales)."""
        got, reference = run_both(*mxfp4_problem(6, 4, 2, hidden=96, inter=160, seed=4, biases=True),
                                  table=[1, 16, 32, 64, 1, 2, 1])
        assert rel_error(got, reference) < TOL[torch.float32]

    def test_what_the_kernels_cannot_run_is_refused(self):
        x, stacks, weights, ids = (t.to(DEVICE) if torch.is_tensor(t) else {k: v.to(DEVICE) for k, v in t.items()}
                                   for t in mxfp4_problem(2, 4, 2, seed=5))
        stacked = [stacks[n] for n in ("w13", "w2")]
        scales = [stacks[n] for n in ("w13_scale", "w2_scale")]
        with pytest.raises(ValueError, match="multiple of 32"):
            torch.ops.atom_triton.fused_moe(x, *stacked, weights, ids, [1, 16, 16, 16, 1, 2, 1], *scales)
        with pytest.raises(ValueError, match="widened to bf16"):
            torch.ops.atom_triton.fused_moe(x.half(), *stacked, weights, ids, TABLE, *scales)
        with pytest.raises(ValueError, match="uint8 e8m0 scales"):
            torch.ops.atom_triton.fused_moe(x, *stacked, weights, ids, TABLE, scales[0].float(), scales[1])


def test_the_triton_backend_in_an_moe_layer_equals_the_reference():
    """MoEExperts holding mxfp4 stacks with biases (the layer any model builds from its weights scheme), run through
    the `triton` moe backend and through `reference`."""
    experts = random_experts(seed=7).to(DEVICE)
    x, _, weights, ids = mxfp4_problem(13, 4, 2, seed=8)
    outs = []
    for choice in (BackendChoice("reference"), BackendChoice("triton", {"fused_moe@1": TABLE[1:7],
                                                                        "fused_moe@4": TABLE[8:14]})):
        experts.moe_backend = make_backend("moe", choice)
        outs.append(experts(x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE)).cpu())
    assert rel_error(outs[1], outs[0]) < TOL[torch.float32]


def test_tuning_times_the_kernels_on_mxfp4_experts(monkeypatch):
    """The build's MoE tuning on an mxfp4 model: the kernels run on uint8 experts (timings scripted, no GPU here),
    only candidates whose K step covers whole scale groups are timed, the fastest per bucket is kept."""
    from atom_aot.build.tune import _tune_moe
    candidates = (triton_moe.MoEConfig(16, 16, 32, 1, 2, 1), triton_moe.MoEConfig(16, 16, 16, 1, 2, 1),
                  triton_moe.MoEConfig(32, 32, 64, 2, 4, 2))
    monkeypatch.setattr(triton_moe, "CANDIDATE_CONFIGS", candidates)
    monkeypatch.setattr(triton_moe, "TOKEN_BUCKETS", (1, 4))
    monkeypatch.setattr("atom_aot.build.tune.PREFILL_MOE_TOKENS", 6)
    times = itertools.chain([2.0, 1.0], [1.0, 3.0])

    def scripted(fn):
        assert fn().isfinite().all()
        return next(times), True
    monkeypatch.setattr("atom_aot.ops.triton.timing.measure_ms", scripted)
    cfg = ModelConfig.from_hf_dict({**MOE_CONFIG, "moe_intermediate_size": 32})
    choice, measured = _tune_moe(cfg, SimpleNamespace(torch_dtype=torch.float32), DEVICE, weights_scheme="mxfp4")
    assert set(measured[6]) == {candidates[0].as_args(), candidates[2].as_args()}      # BLOCK_K 16 is not timed
    assert choice.params == {"fused_moe@1": candidates[2].as_args(), "fused_moe@4": candidates[0].as_args()}
