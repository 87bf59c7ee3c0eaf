"""`atom_triton::softmax_topk`: a MoE router's softmax over experts, its top k and their renormalization, as one
kernel (the `softmax_topk` contract of atom_aot/ops/moe.py, which the `reference` moe backend runs).

Why a kernel: torch's top-k is a sort (a radix select and a bitonic sort per row block) beside separate softmax,
sum and divide kernels: 13 us per layer of a Qwen3-30B-A3B decode step at 256 tokens on an H200 (session 41's
profile), for a [256, 128] input. One program per token holds its row of logits in registers, takes the k largest
probabilities one at a time (the lowest expert id among equal ones), and writes them in descending order, as
torch.topk does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton._common import check_last_dim_contiguous, next_pow2


@triton.jit
def softmax_topk_kernel(logits_ptr, weights_ptr, ids_ptr, stride_t, E: tl.constexpr, E_PAD: tl.constexpr,
                        K: tl.constexpr, K_PAD: tl.constexpr, RENORMALIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, E_PAD)
    logits = tl.load(logits_ptr + row * stride_t + lanes, mask=lanes < E, other=float("-inf")).to(tl.float32)
    exps = tl.exp(logits - tl.max(logits, 0))
    left = tl.where(lanes < E, exps / tl.sum(exps, 0), -1.0)          # probabilities not taken yet
    slots = tl.arange(0, K_PAD)
    weights = tl.zeros((K_PAD,), dtype=tl.float32)
    ids = tl.zeros((K_PAD,), dtype=tl.int32)
    for slot in tl.static_range(K):
        best = tl.max(left, 0)
        pick = tl.min(tl.where(left == best, lanes, E_PAD), 0)
        weights = tl.where(slots == slot, best, weights)
        ids = tl.where(slots == slot, pick, ids)
        left = tl.where(lanes == pick, -1.0, left)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, 0)                         # padded slots hold 0
    tl.store(weights_ptr + row * K + slots, weights, mask=slots < K)
    tl.store(ids_ptr + row * K + slots, ids, mask=slots < K)


@triton_op("atom_triton::softmax_topk", mutates_args=())
def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, k] float32, ids [T, k] int32)."""
    check_last_dim_contiguous("router_logits", router_logits)
    num_tokens, num_experts = router_logits.shape
    if not 0 < top_k <= num_experts:
        raise ValueError(f"softmax_topk: top_k must be in 1..{num_experts} (the experts), got {top_k}")
    weights = torch.empty((num_tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int32, device=router_logits.device)
    wrap_triton(softmax_topk_kernel)[(num_tokens,)](
        router_logits, weights, ids, router_logits.stride(0), E=num_experts, E_PAD=next_pow2(num_experts), K=top_k,
        K_PAD=next_pow2(top_k), RENORMALIZE=renormalize, num_warps=4 if num_experts > 64 else 1)
    return weights, ids
