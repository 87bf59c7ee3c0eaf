"""`atom_triton::sampling_threshold`: each row's top-k / top-p / min-p threshold (the contract of
atom_aot/ops/sampling.py) without sorting the vocabulary.

Why: top-p sorted the whole vocabulary every step (a [N, 151936] sort for Qwen3), which cost 22% of a
Qwen3-0.6B batch-256 workload's throughput on an H100 against greedy (docs/gpu.md).

How: one program per row. The k-th largest logit is the largest value v with at least k logits >= v; the
nucleus threshold is the largest v whose logits >= v (inside the top-k set) carry at least top_p of that
set's mass. Both are searches over the logits' float32 bit patterns, mapped to int32 keys in the same
order (`_keys`), so the answer is exact (a logit of the row): each pass over the row counts, for P pivot
keys at once, the count or the mass at or above each, and keeps the interval between the last pivot that
still reaches the target and the next: 32 bits in 32 / log2(P) passes. Each pass costs P compares per logit
besides its read, so 16 pivots (8 passes) balance the two; each lane sums its own logits per pivot and the
lanes are summed once per pass. A row with top-k and top-p reads its logits about 18 times (max, 8 + 8 search
passes, the top-k set's mass); top-p alone 10 times. One program per row is latency-bound at a few rows (the
sampler keeps the sort there, runtime/sampler.py `KERNEL_MIN_ROWS`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton._common import check_last_dim_contiguous

BLOCK = 256               # logits per load
PIVOTS = 16               # keys tested per pass: 4 bits of the 32 per pass (8 passes; more pivots cost compares)
NEG_INF_KEY = -2139095041     # _keys(-inf): 0xFF800000 ^ 0x7FFFFFFF as an int32


@triton.jit
def _keys(x):
    """float32 -> int32 in the same order (negative floats' magnitude bits flipped)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _value_of(key):
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _row_max(row_ptr, V, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    best = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    for start in range(0, V, BLOCK):
        best = tl.maximum(best, tl.load(row_ptr + start + offs, mask=start + offs < V, other=float("-inf")))
    return tl.max(best, 0)


@triton.jit
def _mass_from(row_ptr, V, floor_key, row_max, BLOCK: tl.constexpr):
    """The sum of exp(logit - row_max) over the logits whose key is >= floor_key."""
    offs = tl.arange(0, BLOCK)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, V, BLOCK):
        x = tl.load(row_ptr + start + offs, mask=start + offs < V, other=float("-inf"))
        total += tl.where(_keys(x) >= floor_key, tl.exp(x - row_max), 0.0)
    return tl.sum(total, 0)


@triton.jit
def _largest_key_reaching(row_ptr, V, lo, hi, target, row_max, BY_MASS: tl.constexpr, BLOCK: tl.constexpr,
                          P: tl.constexpr):
    """The largest key v in [lo, hi] whose logits with key >= v number (BY_MASS: weigh exp(logit - row_max))
    at least `target`; the count at `lo` must reach it. The answer is a logit's key: above it the count drops."""
    offs = tl.arange(0, BLOCK)
    js = tl.arange(0, P)
    while lo < hi:
        span = hi.to(tl.int64) - lo.to(tl.int64)
        pivots = (lo.to(tl.int64) + (span * js.to(tl.int64) + (P - 1)) // P).to(tl.int32)   # pivots[0] = lo
        # per lane and pivot, summed across the lanes once after the pass (not at every load)
        partial = tl.zeros((BLOCK, P), dtype=tl.float32)
        for start in range(0, V, BLOCK):
            inside = start + offs < V
            x = tl.load(row_ptr + start + offs, mask=inside, other=float("-inf"))
            if BY_MASS:
                weight = tl.exp(x - row_max)
            else:
                weight = tl.where(inside, 1.0, 0.0)
            partial += tl.where(_keys(x)[:, None] >= pivots[None, :], weight[:, None], 0.0)
        reached = tl.sum(partial, axis=0)
        j = tl.max(tl.where(reached >= target, js, 0), 0)          # the last pivot still reaching (0 at worst)
        new_lo = tl.sum(tl.where(js == j, pivots, 0), 0)
        hi = tl.min(tl.where(pivots > new_lo, pivots - 1, hi), 0)    # below the next pivot, which falls short
        lo = new_lo
    return lo


@triton.jit
def sampling_threshold_kernel(logits_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, stride, V,
                              BLOCK: tl.constexpr, P: tl.constexpr, NEG_KEY: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    row_max = _row_max(row_ptr, V, BLOCK)
    top_key = _keys(row_max)
    floor_key = top_key - top_key + NEG_KEY                           # an int32 scalar: every logit
    if (top_k > 0) & (top_k < V):
        floor_key = _largest_key_reaching(row_ptr, V, floor_key, top_key, top_k.to(tl.float32), row_max,
                                          False, BLOCK, P)
    threshold = _value_of(floor_key)
    if top_p < 1.0:
        target = top_p * _mass_from(row_ptr, V, floor_key, row_max, BLOCK)
        nucleus_key = _largest_key_reaching(row_ptr, V, floor_key, top_key, target, row_max, True, BLOCK, P)
        threshold = tl.maximum(threshold, _value_of(nucleus_key))
    if min_p > 0.0:
        threshold = tl.maximum(threshold, row_max + tl.log(min_p))
    tl.store(out_ptr + row, threshold)


def launch_sampling_threshold(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                              min_p: torch.Tensor) -> torch.Tensor:
    """logits [N, V] float32, top_k [N] int64, top_p and min_p [N] float32 -> thresholds [N] float32."""
    check_last_dim_contiguous("logits", logits)
    num_rows, vocab = logits.shape
    for name, t, dtype in (("top_k", top_k, torch.int64), ("top_p", top_p, torch.float32),
                           ("min_p", min_p, torch.float32)):
        if t.dtype != dtype or t.shape != (num_rows,) or not t.is_contiguous():
            raise ValueError(f"sampling_threshold: {name} must be a contiguous [{num_rows}] {dtype} tensor, got "
                             f"{tuple(t.shape)} {t.dtype}")
    if logits.dtype != torch.float32:
        raise ValueError(f"sampling_threshold: logits must be float32, got {logits.dtype}")
    out = torch.empty(num_rows, dtype=torch.float32, device=logits.device)
    wrap_triton(sampling_threshold_kernel)[(num_rows,)](
        logits, top_k, top_p, min_p, out, logits.stride(0), vocab, BLOCK=BLOCK, P=PIVOTS, NEG_KEY=NEG_INF_KEY,
        num_warps=8)
    return out


@triton_op("atom_triton::sampling_threshold", mutates_args=())
def sampling_threshold(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       min_p: torch.Tensor) -> torch.Tensor:
    return launch_sampling_threshold(logits, top_k, top_p, min_p)
