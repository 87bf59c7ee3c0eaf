"""GPT-OSS's expert options on the shared MoE op: biases on both projections, the clamped SwiGLU, the router that
takes the top k of its logits before the softmax, and the checkpoint's interleaved gate/up layout.

The reference op against a naive float64 form written from the definitions; atom_triton::fused_moe and
atom_triton::top_k_softmax against the reference (Triton's interpreter without a GPU), on fresh random inputs
whose values reach past the clamp's limit.
"""
import pytest
import torch
import torch.nn.functional as F

from moe_checks import expert_biases, fp8_experts, naive_moe, random_problem
from triton_kernel_checks import rel_error
from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.models.gpt_oss import EXPERT_TENSORS, gate_then_up
from atom_aot.ops.backends import make_backend
from atom_aot.ops.moe import ExpertActivation, ExpertWeights, fused_moe_reference, softmax_topk, top_k_softmax

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
SMALL = [1, 16, 16, 32, 1, 2, 1]       # one bucket: BLOCK_M 16, BLOCK_N 16, BLOCK_K 32, GROUP_M 1, 2 warps, 1 stage
SWIGLU = ExpertActivation("swiglu_clamped", alpha=1.702, limit=0.7)


def problem_with_biases(tokens, experts, top_k, hidden=48, inter=40, seed=0, dtype=torch.float32, device="cpu"):
    x, w13, w2, weights, ids = random_problem(tokens, experts, top_k, hidden, inter, seed=seed, dtype=dtype,
                                              device=device)
    b13, b2 = expert_biases(experts, hidden, inter, seed=seed + 100, dtype=dtype, device=device)
    return x, w13, w2, weights, ids, b13, b2


def reference(x, w13, w2, weights, ids, b13, b2, activation=SWIGLU, scales=(None, None)):
    return fused_moe_reference(x.cpu(), w13.cpu(), w2.cpu(), weights.cpu(), ids.cpu(),
                               *(None if s is None else s.cpu() for s in scales),
                               None if b13 is None else b13.cpu(), None if b2 is None else b2.cpu(),
                               activation.kind, activation.alpha, activation.limit)


class TestReference:
    @pytest.mark.parametrize("tokens,experts,top_k", [(1, 4, 2), (13, 6, 3), (20, 5, 5)])
    def test_matches_naive(self, tokens, experts, top_k):
        x, w13, w2, weights, ids, b13, b2 = problem_with_biases(tokens, experts, top_k, seed=tokens)
        gate_up = torch.einsum("th,eih->tei", x, w13)
        assert (gate_up.abs() > SWIGLU.limit).float().mean() > 0.2          # the clamp is reached, often
        got = reference(x, w13, w2, weights, ids, b13, b2)
        want = naive_moe(x, w13, w2, weights, ids, b13, b2, swiglu=(SWIGLU.alpha, SWIGLU.limit))
        assert rel_error(got, want) < 1e-6

    def test_biases_and_silu_alone(self):
        x, w13, w2, weights, ids, b13, b2 = problem_with_biases(9, 6, 2, seed=3)
        got = reference(x, w13, w2, weights, ids, b13, b2, activation=ExpertActivation())
        assert rel_error(got, naive_moe(x, w13, w2, weights, ids, b13, b2)) < 1e-6
        assert rel_error(got, naive_moe(x, w13, w2, weights, ids)) > 1e-2          # the biases count

    def test_bad_activations_refused(self):
        with pytest.raises(ValueError, match="not one of silu, swiglu_clamped"):
            ExpertActivation("gelu")
        with pytest.raises(ValueError, match="limit > 0"):
            ExpertActivation("swiglu_clamped", 1.702, 0.0)


class TestRouter:
    def test_top_k_softmax_is_transformers_router(self):
        """GptOssTopKRouter after its linear: torch.topk of the logits, a softmax over the k values."""
        logits = 3 * torch.randn(11, 8, generator=torch.Generator().manual_seed(1))
        weights, ids = top_k_softmax(logits, 3)
        values, indices = torch.topk(logits, 3, dim=-1)
        assert weights.dtype == torch.float32 and ids.dtype == torch.int32
        assert torch.equal(ids, indices.int()) and torch.equal(weights, F.softmax(values, dim=-1))
        renormalized, same_ids = softmax_topk(logits, 3, renormalize=True)      # the same weights, computed otherwise
        assert torch.equal(same_ids, ids) and torch.allclose(renormalized, weights, rtol=1e-6, atol=1e-7)

    @pytest.mark.parametrize("tokens,experts,top_k", [(1, 4, 4), (37, 32, 4), (9, 6, 3)])
    def test_triton_kernel_matches(self, tokens, experts, top_k):
        logits = 3 * torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens))
        want_weights, want_ids = top_k_softmax(logits, top_k)
        weights, ids = (t.cpu() for t in torch.ops.atom_triton.top_k_softmax(logits.to(DEVICE), top_k))
        assert torch.equal(ids, want_ids)
        assert torch.allclose(weights, want_weights, rtol=1e-5, atol=1e-7)
        backend = make_backend("moe", BackendChoice("triton", {"fused_moe@1": SMALL[1:]}))
        assert torch.equal(backend.route_top_k_softmax(logits.to(DEVICE), top_k)[1].cpu(), want_ids)


class TestTritonKernel:
    @pytest.mark.parametrize("tokens,experts,top_k", [(1, 4, 2), (21, 6, 3), (40, 8, 4)])
    def test_biases_and_clamped_swiglu(self, tokens, experts, top_k):
        problem = problem_with_biases(tokens, experts, top_k, seed=tokens, device=DEVICE)
        got = torch.ops.atom_triton.fused_moe(*problem[:5], SMALL, None, None, *problem[5:], SWIGLU.kind,
                                              SWIGLU.alpha, SWIGLU.limit)
        assert rel_error(got.cpu(), reference(*problem)) < TOL[torch.float32]

    def test_bf16(self):
        problem = problem_with_biases(12, 6, 2, hidden=64, inter=32, seed=4, dtype=torch.bfloat16, device=DEVICE)
        got = torch.ops.atom_triton.fused_moe(*problem[:5], SMALL, None, None, *problem[5:], SWIGLU.kind,
                                              SWIGLU.alpha, SWIGLU.limit)
        assert got.dtype == torch.bfloat16 and rel_error(got.cpu(), reference(*problem)) < TOL[torch.bfloat16]

    def test_fp8_experts_with_biases(self):
        x, w13, w2, weights, ids, b13, b2 = problem_with_biases(13, 6, 2, hidden=64, inter=48, seed=11, device=DEVICE)
        q13, s13, q2, s2 = (t.to(DEVICE) for t in fp8_experts(w13.cpu(), w2.cpu()))
        want = reference(x, q13, q2, weights, ids, b13, b2, scales=(s13, s2))
        got = torch.ops.atom_triton.fused_moe(x, q13, q2, weights, ids, SMALL, s13, s2, b13, b2, SWIGLU.kind,
                                              SWIGLU.alpha, SWIGLU.limit)
        assert rel_error(got.cpu(), want) < TOL[torch.float32]

    def test_the_backends_agree_and_biases_come_in_pairs(self):
        x, w13, w2, weights, ids, b13, b2 = problem_with_biases(7, 4, 2, seed=8, device=DEVICE)
        experts = ExpertWeights(w13, w2, w13_bias=b13, w2_bias=b2)
        triton_moe = make_backend("moe", BackendChoice("triton", {"fused_moe@1": SMALL[1:]}))
        got = triton_moe(x, experts, weights, ids, SWIGLU)
        want = make_backend("moe", BackendChoice("reference"))(x.cpu(), ExpertWeights(
            w13.cpu(), w2.cpu(), w13_bias=b13.cpu(), w2_bias=b2.cpu()), weights.cpu(), ids.cpu(), SWIGLU)
        assert rel_error(got.cpu(), want) < TOL[torch.float32]
        with pytest.raises(ValueError, match="come together"):
            torch.ops.atom_triton.fused_moe(x, w13, w2, weights, ids, SMALL, None, None, b13, None)


def test_checkpoint_layout_becomes_the_stacks():
    """transformers' GptOssExperts computes x @ gate_up_proj[e] + bias, gate the even columns and up the odd ones;
    our w13 rows (gate's, then up's) and biases give the same gate and up; down_proj [E, I, H] is w2 transposed."""
    g = torch.Generator().manual_seed(5)
    experts, hidden, inter = 3, 10, 6
    gate_up, bias = torch.randn(experts, hidden, 2 * inter, generator=g), torch.randn(experts, 2 * inter, generator=g)
    down, x = torch.randn(experts, inter, hidden, generator=g), torch.randn(4, hidden, generator=g)
    w13, b13 = EXPERT_TENSORS["gate_up_proj"][1](gate_up), EXPERT_TENSORS["gate_up_proj_bias"][1](bias)
    w2 = EXPERT_TENSORS["down_proj"][1](down)
    assert w13.shape == (experts, 2 * inter, hidden) and w2.shape == (experts, hidden, inter)
    for e in range(experts):
        theirs = x @ gate_up[e] + bias[e]
        ours = F.linear(x, w13[e], b13[e])
        torch.testing.assert_close(ours[:, :inter], theirs[:, ::2])
        torch.testing.assert_close(ours[:, inter:], theirs[:, 1::2])
        h = torch.randn(4, inter, generator=g)
        torch.testing.assert_close(F.linear(h, w2[e]), h @ down[e])
    assert gate_then_up(torch.arange(6.0).view(1, 6), dim=1).tolist() == [[0.0, 2.0, 4.0, 1.0, 3.0, 5.0]]
