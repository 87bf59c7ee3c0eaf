"""MoE routers as one kernel each (the contracts of atom_aot/ops/moe.py, which the `reference` moe backend runs):

- `atom_triton::softmax_topk` (Qwen3-MoE, Mixtral): the softmax over experts, its top k, their renormalization;
- `atom_triton::top_k_softmax` (GPT-OSS): the top k of the logits, a softmax over those k (the same kernel);
- `atom_triton::grouped_sigmoid_topk` (DeepSeek-V3): sigmoid scores plus the correction bias, the best
  `topk_group` groups by the sum of their two best biased scores, the top k inside them, the unbiased scores as
  weights, renormalized, scaled.

Why kernels: torch's top-k is a sort (a radix select and a bitonic sort per row block: 13 us per layer of a
Qwen3-30B-A3B decode step at 256 tokens on an H200, profiled, for a [256, 128] input) beside separate
softmax, sum and divide kernels (4 us more); DeepSeek's router is three top-ks, a scatter, masks and a gather. One program per
token holds its row in registers and takes the largest entries one at a time (the lowest index among equal ones),
writing them in descending order.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton._common import check_last_dim_contiguous, next_pow2


@triton.jit
def _take_top_k(ranked, values, lanes, E_PAD: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr):
    """The K lanes of largest `ranked` (-inf: never taken), largest first, the lowest lane among equal ones:
    (their `values` [K_PAD], their lanes [K_PAD] int32), padded slots 0."""
    slots = tl.arange(0, K_PAD)
    taken = tl.zeros((K_PAD,), dtype=tl.float32)
    ids = tl.zeros((K_PAD,), dtype=tl.int32)
    for slot in tl.static_range(K):
        best = tl.max(ranked, 0)
        pick = tl.min(tl.where(ranked == best, lanes, E_PAD), 0)
        taken = tl.where(slots == slot, tl.sum(tl.where(lanes == pick, values, 0.0), 0), taken)
        ids = tl.where(slots == slot, pick, ids)
        ranked = tl.where(lanes == pick, float("-inf"), ranked)
    return taken, ids


@triton.jit
def _store_top_k(weights_ptr, ids_ptr, row, weights, ids, K: tl.constexpr, K_PAD: tl.constexpr):
    slots = tl.arange(0, K_PAD)
    tl.store(weights_ptr + row * K + slots, weights, mask=slots < K)
    tl.store(ids_ptr + row * K + slots, ids, mask=slots < K)


@triton.jit
def softmax_topk_kernel(logits_ptr, weights_ptr, ids_ptr, stride_t, E: tl.constexpr, E_PAD: tl.constexpr,
                        K: tl.constexpr, K_PAD: tl.constexpr, RENORMALIZE: tl.constexpr, TOP_K_FIRST: tl.constexpr):
    """TOP_K_FIRST: the k largest logits, then their softmax (GPT-OSS); else the softmax over all E, its k largest
    probabilities, renormalized if RENORMALIZE."""
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, E_PAD)
    logits = tl.load(logits_ptr + row * stride_t + lanes, mask=lanes < E, other=float("-inf")).to(tl.float32)
    if TOP_K_FIRST:
        top, ids = _take_top_k(logits, logits, lanes, E_PAD, K, K_PAD)
        slots = tl.arange(0, K_PAD)
        exps = tl.where(slots < K, tl.exp(top - tl.max(tl.where(slots < K, top, float("-inf")), 0)), 0.0)
        weights = exps / tl.sum(exps, 0)
    else:
        exps = tl.exp(logits - tl.max(logits, 0))
        probs = tl.where(lanes < E, exps / tl.sum(exps, 0), float("-inf"))
        weights, ids = _take_top_k(probs, probs, lanes, E_PAD, K, K_PAD)
        if RENORMALIZE:
            weights = weights / tl.sum(weights, 0)                         # padded slots hold 0
    _store_top_k(weights_ptr, ids_ptr, row, weights, ids, K, K_PAD)


def launch_softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool,
                        top_k_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, k] float32, ids [T, k] int32); `top_k_first`: top_k_softmax's order."""
    check_last_dim_contiguous("router_logits", router_logits)
    num_tokens, num_experts = router_logits.shape
    if not 0 < top_k <= num_experts:
        raise ValueError(f"softmax_topk: top_k must be in 1..{num_experts} (the experts), got {top_k}")
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=router_logits.device)
    wrap_triton(softmax_topk_kernel)[(num_tokens,)](
        router_logits, weights, ids, router_logits.stride(0), E=num_experts, E_PAD=next_pow2(num_experts), K=top_k,
        K_PAD=next_pow2(top_k), RENORMALIZE=renormalize, TOP_K_FIRST=top_k_first,
        num_warps=4 if num_experts > 64 else 1)
    return weights, ids


@triton_op("atom_triton::softmax_topk", mutates_args=())
def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_softmax_topk(router_logits, top_k, renormalize)


@triton_op("atom_triton::top_k_softmax", mutates_args=())
def top_k_softmax(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_softmax_topk(router_logits, top_k, renormalize=False, top_k_first=True)


@triton.jit
def grouped_sigmoid_topk_kernel(logits_ptr, bias_ptr, weights_ptr, ids_ptr, stride_t, scaling,
                                E: tl.constexpr, E_PAD: tl.constexpr, GROUPS: tl.constexpr, GROUPS_PAD: tl.constexpr,
                                TOPK_GROUP: tl.constexpr, K: tl.constexpr, K_PAD: tl.constexpr,
                                RENORMALIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, E_PAD)
    valid = lanes < E
    scores = tl.sigmoid(tl.load(logits_ptr + row * stride_t + lanes, mask=valid, other=0.0).to(tl.float32))
    biased = tl.where(valid, scores + tl.load(bias_ptr + lanes, mask=valid, other=0.0).to(tl.float32), float("-inf"))
    group = lanes // (E // GROUPS)
    groups = tl.arange(0, GROUPS_PAD)
    group_scores = tl.full((GROUPS_PAD,), float("-inf"), dtype=tl.float32)
    for g in tl.static_range(GROUPS):                       # each group's two best biased scores, summed
        mine = valid & (group == g)
        first = tl.max(tl.where(mine, biased, float("-inf")), 0)
        at = tl.min(tl.where(mine & (biased == first), lanes, E_PAD), 0)
        second = tl.max(tl.where(mine & (lanes != at), biased, float("-inf")), 0)
        group_scores = tl.where(groups == g, first + second, group_scores)
    allowed = lanes < 0                                     # the chosen groups' experts
    for _ in tl.static_range(TOPK_GROUP):
        best = tl.max(group_scores, 0)
        pick = tl.min(tl.where(group_scores == best, groups, GROUPS_PAD), 0)
        allowed = allowed | (group == pick)
        group_scores = tl.where(groups == pick, float("-inf"), group_scores)
    weights, ids = _take_top_k(tl.where(allowed & valid, biased, float("-inf")), scores, lanes, E_PAD, K, K_PAD)
    if RENORMALIZE:
        weights = weights / (tl.sum(weights, 0) + 1e-20)     # padded slots hold 0
    _store_top_k(weights_ptr, ids_ptr, row, weights * tl.cast(scaling, tl.float32), ids, K, K_PAD)


def launch_grouped_sigmoid_topk(router_logits: torch.Tensor, correction_bias: torch.Tensor, n_group: int,
                                topk_group: int, top_k: int, renormalize: bool,
                                scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] float32, correction_bias [E] float32 -> (weights [T, k] float32, ids [T, k] int32)."""
    check_last_dim_contiguous("router_logits", router_logits)
    num_tokens, num_experts = router_logits.shape
    per_group = num_experts // n_group if n_group > 0 and num_experts % n_group == 0 else 0
    if per_group < 2 or not 0 < topk_group <= n_group or not 0 < top_k <= topk_group * per_group:
        raise ValueError(f"grouped_sigmoid_topk: {num_experts} experts in n_group={n_group} groups of at least 2, "
                         f"topk_group in 1..n_group and top_k at most the chosen groups' experts, got "
                         f"topk_group={topk_group}, top_k={top_k}")
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=router_logits.device)
    wrap_triton(grouped_sigmoid_topk_kernel)[(num_tokens,)](
        router_logits, correction_bias.contiguous(), weights, ids, router_logits.stride(0), scaling, E=num_experts,
        E_PAD=next_pow2(num_experts), GROUPS=n_group, GROUPS_PAD=next_pow2(n_group), TOPK_GROUP=topk_group, K=top_k,
        K_PAD=next_pow2(top_k), RENORMALIZE=renormalize, num_warps=4 if num_experts > 64 else 1)
    return weights, ids


@triton_op("atom_triton::grouped_sigmoid_topk", mutates_args=())
def grouped_sigmoid_topk(router_logits: torch.Tensor, correction_bias: torch.Tensor, n_group: int, topk_group: int,
                         top_k: int, renormalize: bool, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    return launch_grouped_sigmoid_topk(router_logits, correction_bias, n_group, topk_group, top_k, renormalize,
                                       scaling)
