"""`atom::fused_moe` (the torch reference) and `softmax_topk` against naive per-token math."""
import pytest
import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.errors import ArtifactError
from atom_aot.ops.backends import make_backend
from atom_aot.ops.backends.moe import bucket_table
from atom_aot.ops.moe import ExpertWeights, fused_moe, softmax_topk
from moe_checks import naive_moe, random_problem


class TestSoftmaxTopk:
    @pytest.mark.parametrize("renormalize", [True, False])
    def test_matches_softmax_then_topk(self, renormalize):
        logits = torch.randn(7, 6, dtype=torch.float64)
        weights, ids = softmax_topk(logits, 3, renormalize)
        probs = torch.softmax(logits, -1)
        top = probs.topk(3, -1)
        expected = top.values / top.values.sum(-1, keepdim=True) if renormalize else top.values
        assert weights.dtype == torch.float32 and ids.dtype == torch.int32
        assert torch.equal(ids, top.indices.int())
        torch.testing.assert_close(weights, expected.float())

    def test_bf16_logits_route_in_float32(self):
        weights, _ = softmax_topk(torch.randn(4, 8).bfloat16(), 2, renormalize=True)
        assert weights.dtype == torch.float32
        torch.testing.assert_close(weights.sum(-1), torch.ones(4))


class TestReference:
    @pytest.mark.parametrize("tokens,experts,top_k", [(1, 6, 3), (9, 8, 2), (5, 5, 5), (33, 7, 1)])
    def test_matches_naive(self, tokens, experts, top_k):
        problem = random_problem(tokens, experts, top_k, seed=tokens)
        torch.testing.assert_close(fused_moe(*problem).double(), naive_moe(*problem), rtol=1e-5, atol=1e-5)

    def test_experts_without_tokens_and_one_token_everywhere(self):
        starve = torch.zeros(8)
        starve[[1, 4, 6]] = -1e4           # these experts get no token
        problem = random_problem(12, 8, 2, seed=1, router_bias=starve)
        assert not set(problem[4].flatten().tolist()) & {1, 4, 6}
        torch.testing.assert_close(fused_moe(*problem).double(), naive_moe(*problem), rtol=1e-5, atol=1e-5)
        everywhere = random_problem(1, 8, 8, seed=2)      # k = E
        assert sorted(everywhere[4][0].tolist()) == list(range(8))
        torch.testing.assert_close(fused_moe(*everywhere).double(), naive_moe(*everywhere), rtol=1e-5, atol=1e-5)

    def test_negative_ids_contribute_nothing(self):
        """Expert parallelism masks experts of other ranks with -1: the same as dropping those slots."""
        x, w13, w2, weights, ids = random_problem(10, 6, 3, seed=3)
        masked = torch.where(ids % 2 == 0, ids, -1)
        kept = torch.where(masked >= 0, weights, 0.0)
        got = fused_moe(x, w13, w2, weights, masked)
        torch.testing.assert_close(got, fused_moe(x, w13, w2, kept, ids.clamp(min=0) * (masked >= 0)), rtol=1e-6,
                                   atol=1e-6)
        torch.testing.assert_close(got.double(), naive_moe(x, w13, w2, weights, masked), rtol=1e-5, atol=1e-5)
        assert torch.equal(fused_moe(x, w13, w2, weights, torch.full_like(ids, -1)), torch.zeros_like(x))

    def test_bf16_sums_in_float32(self):
        problem = random_problem(16, 6, 3, seed=4, dtype=torch.bfloat16)
        got = fused_moe(*problem)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.double(), naive_moe(*problem), rtol=2e-2, atol=2e-2)

    def test_export_keeps_the_op_whole(self):
        x, w13, w2, weights, ids = random_problem(6, 4, 2, seed=5)

        class Block(torch.nn.Module):
            def forward(self, x, weights, ids):
                return fused_moe(x, w13, w2, weights, ids) * 2

        tokens = torch.export.Dim("tokens", min=1, max=1024)
        ep = torch.export.export(Block(), (x, weights, ids), dynamic_shapes=({0: tokens}, {0: tokens}, {0: tokens}))
        targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
        assert torch.ops.atom.fused_moe.default in targets
        torch.testing.assert_close(ep.module()(x, weights, ids), 2 * fused_moe(x, w13, w2, weights, ids))


class TestBackendChoice:
    def test_reference_backend_runs_the_op(self):
        x, w13, w2, weights, ids = random_problem(3, 4, 2, seed=6)
        backend = make_backend("moe", BackendChoice("reference"))
        assert torch.equal(backend(x, ExpertWeights(w13, w2), weights, ids), fused_moe(x, w13, w2, weights, ids))

    def test_bucket_table_sorted_by_first_token_count(self):
        choice = BackendChoice("triton", {"fused_moe@64": (64, 64, 32, 8, 4, 3), "fused_moe@1": (16, 32, 64, 1, 4, 2)})
        assert bucket_table(choice) == (1, 16, 32, 64, 1, 4, 2, 64, 64, 64, 32, 8, 4, 3)

    @pytest.mark.parametrize("params", [
        {"fused_moe@2": (16, 32, 64, 1, 4, 2)},                      # no bucket for T = 1
        {"fused_moe@1": (16, 32, 64, 1, 4)},                         # 5 ints
        {"fused_moe@1": (16, 32, 64, 1, 4, 2), "moe@8": (16, 32, 64, 1, 4, 2)},
        {"fused_moe@1": (0, 32, 64, 1, 4, 2)},
    ])
    def test_malformed_params_refused(self, params):
        with pytest.raises(ArtifactError, match="Rebuild the artifact"):
            bucket_table(BackendChoice("triton", params))


def test_fp8_experts_are_their_dequantized_weights():
    """e4m3 stacks with per-row scales: the reference equals the float64 naive form over the dequantized
    weights (the products are scaled, not the weights: the same function), and stays near the bf16 experts."""
    from moe_checks import dequantized, fp8_experts, naive_moe, random_problem
    from atom_aot.ops.moe import fused_moe_reference
    x, w13, w2, weights, ids = random_problem(11, 6, 3, hidden=40, inter=24, seed=9)
    q13, s13, q2, s2 = fp8_experts(w13, w2)
    assert q13.dtype == torch.float8_e4m3fn and s13.shape == (6, 48) and s2.shape == (6, 40)
    got = fused_moe_reference(x, q13, q2, weights, ids, s13, s2)
    expected = naive_moe(x, dequantized(q13, s13), dequantized(q2, s2), weights, ids)
    assert ((got.double() - expected).norm() / expected.norm()).item() < 1e-5
    exact = naive_moe(x, w13, w2, weights, ids)
    assert ((got.double() - exact).norm() / exact.norm()).item() < 0.05
