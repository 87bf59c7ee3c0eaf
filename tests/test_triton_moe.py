"""atom_triton::fused_moe against the `atom::fused_moe` reference on fresh random inputs, with every
buffer the op allocates NaN-poisoned, under TRITON_INTERPRET=1 without a GPU: experts that get no
token, one token routed to every expert, odd E and k, T = 1 and T larger than a row tile, masked
(other-rank) experts, several token-count buckets in one table."""
import pytest
import torch

from moe_checks import random_problem
from triton_kernel_checks import rel_error
from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.ops.moe import fused_moe_reference
from atom_aot.ops.triton import fused_moe as triton_moe
from atom_aot.ops.triton.fused_moe import in_bucket, sort_by_expert, table_buckets

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
SMALL = [1, 16, 16, 32, 1, 2, 1]       # one bucket: BLOCK_M 16, BLOCK_N 16, BLOCK_K 32, GROUP_M 1, 2 warps, 1 stage


def check(problem, table=SMALL, dtype=torch.float32):
    reference = fused_moe_reference(*(t.cpu() for t in problem))
    got = torch.ops.atom_triton.fused_moe(*problem, table)
    assert got.dtype == dtype and got.shape == problem[0].shape
    assert rel_error(got.cpu(), reference) < TOL[dtype]


class TestFusedMoE:
    @pytest.mark.parametrize("tokens,experts,top_k", [(1, 6, 3), (1, 8, 2), (7, 5, 3), (40, 8, 2), (21, 3, 1)])
    def test_matches_reference(self, tokens, experts, top_k):
        check(random_problem(tokens, experts, top_k, hidden=48, inter=40, seed=tokens, device=DEVICE))

    def test_experts_without_tokens(self):
        starve = torch.zeros(7)
        starve[[0, 3, 6]] = -1e4
        problem = random_problem(18, 7, 2, seed=1, device=DEVICE, router_bias=starve)
        assert not set(problem[4].flatten().tolist()) & {0, 3, 6}
        check(problem)

    def test_one_token_routed_to_every_expert(self):
        check(random_problem(1, 5, 5, seed=2, device=DEVICE))        # k = E

    def test_masked_experts_contribute_nothing(self):
        x, w13, w2, weights, ids = random_problem(9, 6, 3, seed=3, device=DEVICE)
        masked = torch.where(ids % 3 == 1, -1, ids)
        check((x, w13, w2, weights, masked))
        none = torch.ops.atom_triton.fused_moe(x, w13, w2, weights, torch.full_like(ids, -1), SMALL)
        assert torch.equal(none, torch.zeros_like(x))

    def test_bf16(self):
        check(random_problem(12, 6, 2, hidden=64, inter=32, seed=4, dtype=torch.bfloat16, device=DEVICE),
              dtype=torch.bfloat16)

    @pytest.mark.parametrize("tokens", [1, 3, 4, 9])
    def test_bucket_table_picks_by_token_count(self, tokens):
        """Three buckets with other tiles (BLOCK_M 16 / 32 with GROUP_M 2 / 64): each T runs exactly one."""
        table = [1, 16, 16, 16, 1, 2, 1, 3, 32, 32, 16, 2, 4, 1, 8, 64, 16, 32, 1, 4, 1]
        check(random_problem(tokens, 6, 3, seed=5 + tokens, device=DEVICE), table)


class TestHelpers:
    def test_sort_by_expert(self):
        ids = torch.tensor([[2, 0], [-1, 2], [0, 1]], dtype=torch.int32, device=DEVICE)
        order, offsets = sort_by_expert(ids, 4)
        assert order.tolist() == [1, 4, 5, 0, 3, 2]      # stable within an expert; -1 sorts last
        assert offsets.tolist() == [0, 2, 3, 5, 5]

    @pytest.mark.parametrize("tokens,experts,top_k", [(1, 6, 3), (300, 7, 4), (700, 128, 8), (5, 3, 3)])
    def test_sort_by_expert_is_a_stable_sort(self, tokens, experts, top_k):
        """Against torch's stable sort on fresh random ids (more than one program step of assignments, experts
        that get none, ids < 0 from other ranks)."""
        gen = torch.Generator().manual_seed(tokens * 31 + experts)
        ids = torch.randint(-1, experts, (tokens, top_k), generator=gen, dtype=torch.int32)
        ids[ids == experts // 2] = 0                                     # an expert with no assignment
        order, offsets = sort_by_expert(ids.to(DEVICE), experts)
        keys = torch.where(ids.flatten() < 0, experts, ids.flatten())
        sorted_keys, expected = torch.sort(keys, stable=True)
        assert order.cpu().tolist() == expected.tolist()
        assert offsets.cpu().tolist() == torch.searchsorted(sorted_keys, torch.arange(experts + 1, dtype=keys.dtype)).tolist()

    def test_in_bucket(self):
        assert [in_bucket(t, 4, 8) for t in (3, 4, 7, 8)] == [0, 1, 1, 0]
        assert [in_bucket(t, 512, None) for t in (511, 512, 9000)] == [0, 1, 1]

    def test_table_merges_equal_neighbours(self):
        row = [16, 32, 64, 1, 4, 2]
        buckets = table_buckets([1, *row, 2, *row, 4, 64, 32, 64, 8, 4, 2])
        assert [(first, nxt) for first, nxt, _ in buckets] == [(1, 4), (4, None)]

    @pytest.mark.parametrize("table", [[2, 16, 32, 64, 1, 4, 2], [1, 16, 32, 64, 1, 4], [1, 8, 32, 64, 1, 4, 2],
                                       [1, 16, 32, 64, 1, 4, 2, 1, 16, 32, 64, 1, 4, 2]])
    def test_bad_tables_refused(self, table):
        with pytest.raises(ValueError):
            table_buckets(table)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_experts_match_the_reference(dtype):
    """e4m3 w13 / w2 with per-row scales: tiles widened in registers, products scaled after the K loop."""
    from moe_checks import fp8_experts
    x, w13, w2, weights, ids = random_problem(13, 6, 2, hidden=64, inter=48, seed=11, dtype=dtype, device=DEVICE)
    q13, s13, q2, s2 = (t.to(DEVICE) for t in fp8_experts(w13.cpu(), w2.cpu()))
    reference = fused_moe_reference(x.cpu(), q13.cpu(), q2.cpu(), weights.cpu(), ids.cpu(), s13.cpu(), s2.cpu())
    got = torch.ops.atom_triton.fused_moe(x, q13, q2, weights, ids, SMALL, s13, s2)
    assert got.dtype == dtype and rel_error(got.cpu(), reference) < TOL[dtype]


def test_block_scaled_fp8_experts_match_the_reference():
    """128x128 block scales (H = 256, I = 128), W8A8: the tokens and the SiLU-mul output quantized per 1x128 group,
    each K step's e4m3 product scaled by its group's and its block's scales; against float64 over the same
    quantized values (and, further off, over unquantized activations: the W8A8 error)."""
    from moe_checks import block_dequantized, block_fp8_experts, group_quantized, naive_moe
    x, w13, w2, weights, ids = random_problem(9, 4, 2, hidden=256, inter=128, seed=12, device=DEVICE)
    q13, s13, q2, s2 = (t.to(DEVICE) for t in block_fp8_experts(w13.cpu(), w2.cpu()))
    assert s13.shape == (4, 2, 2) and s2.shape == (4, 2, 1)
    reference = fused_moe_reference(x.cpu(), q13.cpu(), q2.cpu(), weights.cpu(), ids.cpu(), s13.cpu(), s2.cpu())
    w13d, w2d = block_dequantized(q13.cpu(), s13.cpu()), block_dequantized(q2.cpu(), s2.cpu())
    assert rel_error(reference.double(), naive_moe(x, w13d, w2d, weights, ids, activations=group_quantized)) < 1e-5
    assert 1e-3 < rel_error(reference.double(), naive_moe(x, w13d, w2d, weights, ids)) < 0.1
    # the kernel against the reference on its own device: the SiLU-mul output's e4m3 rounding is that close to a
    # code boundary at times that CPU and CUDA arithmetic round one element apart (a 2.6% row at this seed on H200)
    here = fused_moe_reference(x, q13, q2, weights, ids, s13, s2).cpu()
    table = [1, 16, 32, 64, 1, 2, 1]         # BLOCK_K 64: two steps per scale block
    got = torch.ops.atom_triton.fused_moe(x, q13, q2, weights, ids, table, s13, s2)
    assert rel_error(got.cpu(), here) < TOL[torch.float32]
    with pytest.raises(ValueError, match="BLOCK_K dividing 128"):
        torch.ops.atom_triton.fused_moe(x, q13, q2, weights, ids, [1, 16, 32, 256, 1, 2, 1], s13, s2)


@pytest.mark.parametrize("tokens,experts,top_k,renormalize,dtype", [
    (1, 6, 3, True, torch.float32), (37, 128, 8, True, torch.bfloat16), (5, 8, 2, False, torch.float32),
    (16, 60, 4, False, torch.bfloat16), (3, 5, 5, True, torch.float32)])
def test_softmax_topk_kernel_matches_the_reference_router(tokens, experts, top_k, renormalize, dtype):
    """atom_triton::softmax_topk against ops/moe.py softmax_topk on fresh random logits: the same weights in the
    same (descending) order, k distinct experts whose probabilities they are, and where a row's logits are all
    distinct (float32 here) the same experts; bf16 logits tie, and among equal ones the kernel takes the lowest
    expert id where torch.topk promises no order. Odd expert counts, k = E, both normalizations."""
    from atom_aot.ops.moe import softmax_topk
    gen = torch.Generator().manual_seed(tokens * 7 + experts)
    logits = (3 * torch.randn(tokens, experts, generator=gen)).to(dtype)
    want_weights, want_ids = softmax_topk(logits, top_k, renormalize)
    weights, ids = (t.cpu() for t in torch.ops.atom_triton.softmax_topk(logits.to(DEVICE), top_k, renormalize))
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.allclose(weights, want_weights, rtol=1e-5, atol=1e-7)
    assert all(len(set(row)) == top_k for row in ids.tolist())
    taken = torch.softmax(logits.float(), dim=-1).gather(1, ids.long())
    assert torch.allclose(taken / taken.sum(-1, keepdim=True) if renormalize else taken, weights, rtol=1e-5, atol=1e-7)
    distinct = torch.tensor([len(set(row)) == experts for row in logits.tolist()])
    assert torch.equal(ids[distinct], want_ids[distinct])
    if dtype == torch.float32:
        assert distinct.all()


def test_softmax_topk_kernel_refuses_more_slots_than_experts():
    with pytest.raises(ValueError, match="top_k must be in 1..4"):
        torch.ops.atom_triton.softmax_topk(torch.randn(2, 4, device=DEVICE), 5, True)


@pytest.mark.parametrize("experts,n_group,topk_group,top_k,renormalize", [
    (256, 8, 4, 8, True), (16, 4, 2, 4, False), (6, 1, 1, 3, True), (12, 3, 2, 5, True), (64, 8, 3, 6, False),
    (384, 1, 1, 8, True), (160, 1, 1, 8, True)])
def test_grouped_sigmoid_topk_kernel_matches_deepseeks_router(experts, n_group, topk_group, top_k, renormalize):
    """atom_triton::grouped_sigmoid_topk against ops/moe.py grouped_sigmoid_topk (HF's DeepseekV3TopkRouter) on
    fresh random logits and biases (DeepSeek-V3's 256 experts in 8 groups, odd groups, one group; Kimi-K2's 384 and
    GLM-4.5's 160 experts in one group, top-8): the same expert set per token (the reference's order is
    unspecified: sorted=False) with the same weights."""
    from atom_aot.ops.moe import GroupedTopK, grouped_sigmoid_topk
    gen = torch.Generator().manual_seed(experts * 5 + top_k)
    logits = 2 * torch.randn(37, experts, generator=gen)
    bias = 0.1 * torch.randn(experts, generator=gen)
    want_weights, want_ids = grouped_sigmoid_topk(logits, bias, GroupedTopK(n_group, topk_group, top_k, renormalize, 2.5))
    weights, ids = (t.cpu() for t in torch.ops.atom_triton.grouped_sigmoid_topk(
        logits.to(DEVICE), bias.to(DEVICE), n_group, topk_group, top_k, renormalize, 2.5))
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    got, want = ids.sort(dim=-1), want_ids.sort(dim=-1)
    assert torch.equal(got.values, want.values)
    assert torch.allclose(weights.gather(1, got.indices), want_weights.gather(1, want.indices), rtol=1e-5, atol=1e-7)


def test_grouped_sigmoid_topk_kernel_refuses_what_the_router_cannot_do():
    with pytest.raises(ValueError, match="n_group=4 groups of at least 2"):
        torch.ops.atom_triton.grouped_sigmoid_topk(torch.randn(2, 4, device=DEVICE), torch.zeros(4, device=DEVICE),
                                                   4, 1, 1, True, 1.0)
    with pytest.raises(ValueError, match="top_k=5"):
        torch.ops.atom_triton.grouped_sigmoid_topk(torch.randn(2, 8, device=DEVICE), torch.zeros(8, device=DEVICE),
                                                   2, 1, 5, True, 1.0)


def test_the_triton_backend_routes_as_the_reference_backend():
    """The `moe` backends' routers side by side (what SparseMoeBlock and DeepseekMoE call): the same experts and
    weights from the triton backend's kernels as from the reference backend's torch."""
    from atom_aot.artifact.tuning import BackendChoice
    from atom_aot.ops.backends import make_backend
    from atom_aot.ops.moe import GroupedTopK
    reference = make_backend("moe", BackendChoice("reference"))
    triton_moe = make_backend("moe", BackendChoice("triton", {"fused_moe@1": list(SMALL[1:])}))
    gen = torch.Generator().manual_seed(11)
    logits, bias = torch.randn(9, 16, generator=gen), 0.1 * torch.randn(16, generator=gen)
    routing = GroupedTopK(n_group=4, topk_group=2, top_k=3, renormalize=True, scaling=1.5)
    for got, want in ((triton_moe.route(logits.to(DEVICE), 4, True), reference.route(logits, 4, True)),
                      (triton_moe.route_grouped(logits.to(DEVICE), bias.to(DEVICE), routing),
                       reference.route_grouped(logits, bias, routing))):
        ids, order = got[1].cpu().sort(dim=-1)
        want_ids, want_order = want[1].sort(dim=-1)
        assert torch.equal(ids, want_ids)
        assert torch.allclose(got[0].cpu().gather(1, order), want[0].gather(1, want_order), rtol=1e-5, atol=1e-7)
