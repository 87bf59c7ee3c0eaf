"""`atom_triton::sampling_threshold`: each row's top-k / top-p / min-p threshold (the contract of
atom_aot/ops/sampling.py) without sorting the vocabulary.

Why: top-p sorted the whole vocabulary every step (a [N, 151936] sort for Qwen3), which cost 22% of a
Qwen3-0.6B batch-256 workload's throughput on an H100 against greedy (docs/performance.md). A first kernel with one
program per row was latency-bound (each program looped over 152k logits per pass; 256 rows on 132 SMs).

How: the k-th largest logit is the largest value v with at least k logits >= v; the nucleus threshold is the
largest v whose logits >= v (inside the top-k set) carry at least top_p of that set's mass. Both are searches over
the logits' float32 bit patterns, mapped to int32 keys in the same order (`_keys`), so the answer is exact (a
logit of the row): each pass counts (top-k) or weighs by exp(logit - max) (top-p), for P pivot keys at once, the
logits at or above each, and keeps the interval between the last pivot that still reaches the target and the
next: 32 bits in 32 / log2(P) passes. Each row is split into chunks of at least MIN_CHUNK logits, so that rows x
splits fill the GPU: every pass is one launch over (rows, splits) whose programs write their chunk's sums per
pivot to their own slot of a scratch buffer (a slot per pass: no races), and the next pass's programs sum their
row's slots in a fixed order, so they all derive the same next interval (split 0 records it). The first pass
also takes each chunk's max; the first nucleus pass's lowest pivot is the top-k set itself, so its sum is the
set's mass. A last launch per row turns the final sums into the threshold. The pass count is fixed (no host
reads: torch.export and AOTInductor keep the op whole with rows and vocabulary symbolic); a row's programs
return at once in the passes of a search it does not need (no top-k, top_p >= 1). Masses are float64 sums of
libdevice's float32 exp (the exp torch's CUDA kernels call), as the reference computes them; counts are exact.
Under TRITON_INTERPRET=1 libdevice is not callable: the tests supply its exp and log through torch's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton
from triton.language.extra import libdevice

from atom_aot.ops.triton._common import check_last_dim_contiguous

BLOCK = 512                 # logits per load
PIVOTS = 16                 # keys tested per pass: 4 of the 32 bits per pass (more pivots cost compares)
PASSES = 8                  # 32 bits / log2(PIVOTS): passes per search
MIN_CHUNK = 4096            # logits per program per pass at least (fewer: the programs' fixed costs dominate)
MAX_SPLITS = 64             # programs per row at most (the partial sums a program reduces: one tile)
TARGET_PROGRAMS = 1024      # rows x splits to aim for: several programs per SM on 132 SMs
NEG_INF_KEY = -2139095041   # _keys(-inf): 0xFF800000 ^ 0x7FFFFFFF as an int32
POS_INF_KEY = 2139095040    # _keys(+inf): 0x7F800000


@triton.jit
def _keys(x):
    """float32 -> int32 in the same order (negative floats' magnitude bits flipped); -0.0 is 0.0's key, as the
    two compare equal (a row's tokens at -0.0 and 0.0 are kept or masked together)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(x == 0.0, 0, tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF))


@triton.jit
def _value_of(key):
    bits = tl.where(key >= 0, key, key ^ 0x7FFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _pivots(lo, hi, P: tl.constexpr):
    """P keys spread over [lo, hi], the first at lo (int64 arithmetic: the span may reach 2^32)."""
    js = tl.arange(0, P).to(tl.int64)
    span = hi.to(tl.int64) - lo.to(tl.int64)
    return (lo.to(tl.int64) + (span * js + (P - 1)) // P).to(tl.int32)


@triton.jit
def _row_sums(sums_ptr, row, slot, splits, STEPS: tl.constexpr, P: tl.constexpr, MAX_SPLITS: tl.constexpr):
    """[P] float64: one pass's sums per pivot over the row's splits, added in a fixed order (every program the same)."""
    s = tl.arange(0, MAX_SPLITS)
    js = tl.arange(0, P)
    base = sums_ptr + ((row * STEPS + slot) * splits) * P
    part = tl.load(base + s[:, None] * P + js[None, :], mask=s[:, None] < splits, other=0.0)
    return tl.sum(part, 0)


@triton.jit
def _narrowed(bounds_ptr, sums_ptr, row, slot, splits, target, STEPS: tl.constexpr, P: tl.constexpr,
              MAX_SPLITS: tl.constexpr):
    """The interval after pass `slot`: from its pivots' sums over the row, the last pivot still reaching `target`
    (pivot 0 at worst: it reaches by construction) up to just below the next, which falls short."""
    lo = tl.load(bounds_ptr + (row * STEPS + slot) * 2)
    hi = tl.load(bounds_ptr + (row * STEPS + slot) * 2 + 1)
    pivots = _pivots(lo, hi, P)
    js = tl.arange(0, P)
    reached = _row_sums(sums_ptr, row, slot, splits, STEPS, P, MAX_SPLITS)
    j = tl.max(tl.where(reached >= target, js, 0), 0)
    new_lo = tl.sum(tl.where(js == j, pivots, 0), 0)
    new_hi = tl.min(tl.where(pivots > new_lo, pivots - 1, hi), 0)
    return new_lo, new_hi


@triton.jit
def _row_max(max_ptr, row, splits, MAX_SPLITS: tl.constexpr):
    s = tl.arange(0, MAX_SPLITS)
    return tl.max(tl.load(max_ptr + row * splits + s, mask=s < splits, other=float("-inf")), 0)


@triton.jit
def _nucleus_target(sums_ptr, row, top_p, splits, STEPS: tl.constexpr, P: tl.constexpr, MAX_SPLITS: tl.constexpr,
                    PASSES: tl.constexpr):
    """top_p of the top-k set's mass (float64): the first nucleus pass's sum at its lowest pivot, the set's floor."""
    js = tl.arange(0, P)
    total = tl.sum(tl.where(js == 0, _row_sums(sums_ptr, row, PASSES, splits, STEPS, P, MAX_SPLITS), 0.0), 0)
    return top_p.to(tl.float64) * total


@triton.jit
def _top_k_floor(bounds_ptr, sums_ptr, row, top_k, V, splits, NEG_KEY: tl.constexpr, STEPS: tl.constexpr,
                 P: tl.constexpr, MAX_SPLITS: tl.constexpr, PASSES: tl.constexpr):
    """The k-th largest logit's key after the top-k search's last pass; NEG_KEY (every logit) without top-k."""
    floor_key = tl.full((), NEG_KEY, tl.int32)
    if (top_k > 0) & (top_k < V):
        floor_key, _ = _narrowed(bounds_ptr, sums_ptr, row, PASSES - 1, splits, top_k.to(tl.float64), STEPS, P,
                                 MAX_SPLITS)
    return floor_key


@triton.jit
def search_pass_kernel(logits_ptr, top_k_ptr, top_p_ptr, min_p_ptr, max_ptr, bounds_ptr, sums_ptr, stride, V, chunk,
                       splits, step, NUCLEUS: tl.constexpr, BLOCK: tl.constexpr, P: tl.constexpr, PASSES: tl.constexpr,
                       MAX_SPLITS: tl.constexpr, NEG_KEY: tl.constexpr, POS_KEY: tl.constexpr):
    """One pass of one search over (rows, splits): slot `step` of the scratch (top-k 0..PASSES-1, nucleus after)."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    STEPS: tl.constexpr = 2 * PASSES
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    row_ptr = logits_ptr + row * stride
    offs = tl.arange(0, BLOCK)
    start = split * chunk
    if not NUCLEUS:
        if (step == 0) & ((top_p < 1.0) | (tl.load(min_p_ptr + row) > 0.0)):   # each chunk's max (masses, min-p)
            best = tl.full((BLOCK,), float("-inf"), tl.float32)
            for at in range(start, start + chunk, BLOCK):
                best = tl.maximum(best, tl.load(row_ptr + at + offs, mask=at + offs < V, other=float("-inf")))
            tl.store(max_ptr + row * splits + split, tl.max(best, 0))
        searching = (top_k > 0) & (top_k < V)
    else:
        searching = top_p < 1.0
    if searching:
        if step == NUCLEUS * PASSES:     # a search's first pass: its whole range
            if NUCLEUS:
                lo = _top_k_floor(bounds_ptr, sums_ptr, row, top_k, V, splits, NEG_KEY, STEPS, P, MAX_SPLITS, PASSES)
                hi = _keys(_row_max(max_ptr, row, splits, MAX_SPLITS))
            else:
                lo = tl.full((), NEG_KEY, tl.int32)
                hi = tl.full((), POS_KEY, tl.int32)
        else:
            if NUCLEUS:
                target = _nucleus_target(sums_ptr, row, top_p, splits, STEPS, P, MAX_SPLITS, PASSES)
            else:
                target = top_k.to(tl.float64)
            lo, hi = _narrowed(bounds_ptr, sums_ptr, row, step - 1, splits, target, STEPS, P, MAX_SPLITS)
        if split == 0:
            tl.store(bounds_ptr + (row * STEPS + step) * 2, lo)
            tl.store(bounds_ptr + (row * STEPS + step) * 2 + 1, hi)
        pivots = _pivots(lo, hi, P)
        # per lane and pivot, summed across the lanes once after the chunk (not at every load)
        if NUCLEUS:
            row_max = _row_max(max_ptr, row, splits, MAX_SPLITS)
            acc = tl.zeros((BLOCK, P), tl.float64)
            for at in range(start, start + chunk, BLOCK):
                x = tl.load(row_ptr + at + offs, mask=at + offs < V, other=float("-inf"))
                weight = libdevice.exp(x - row_max).to(tl.float64)
                acc += tl.where(_keys(x)[:, None] >= pivots[None, :], weight[:, None], 0.0)
            sums = tl.sum(acc, 0)
        else:
            counts = tl.zeros((BLOCK, P), tl.int32)
            for at in range(start, start + chunk, BLOCK):
                inside = at + offs < V
                x = tl.load(row_ptr + at + offs, mask=inside, other=float("-inf"))
                counts += ((_keys(x)[:, None] >= pivots[None, :]) & inside[:, None]).to(tl.int32)
            sums = tl.sum(counts, 0).to(tl.float64)
        js = tl.arange(0, P)
        tl.store(sums_ptr + ((row * STEPS + step) * splits + split) * P + js, sums)


@triton.jit
def threshold_kernel(top_k_ptr, top_p_ptr, min_p_ptr, max_ptr, bounds_ptr, sums_ptr, out_ptr, V, splits,
                     P: tl.constexpr, PASSES: tl.constexpr, MAX_SPLITS: tl.constexpr, NEG_KEY: tl.constexpr):
    """Per row, after the searches: the largest of the k-th largest logit, the nucleus' last logit, max + log(min_p)."""
    row = tl.program_id(0).to(tl.int64)
    STEPS: tl.constexpr = 2 * PASSES
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    threshold = _value_of(_top_k_floor(bounds_ptr, sums_ptr, row, top_k, V, splits, NEG_KEY, STEPS, P, MAX_SPLITS,
                                       PASSES))
    if top_p < 1.0:
        target = _nucleus_target(sums_ptr, row, top_p, splits, STEPS, P, MAX_SPLITS, PASSES)
        nucleus_key, _ = _narrowed(bounds_ptr, sums_ptr, row, STEPS - 1, splits, target, STEPS, P, MAX_SPLITS)
        threshold = tl.maximum(threshold, _value_of(nucleus_key))
    if min_p > 0.0:
        threshold = tl.maximum(threshold, _row_max(max_ptr, row, splits, MAX_SPLITS) + libdevice.log(min_p))
    tl.store(out_ptr + row, threshold)


def split_rows(num_rows, vocab):
    """(splits, chunk): programs per row and logits per program (a multiple of BLOCK), enough programs in all
    (TARGET_PROGRAMS) with chunks of MIN_CHUNK logits at least. Expressions of symbolic sizes, never guards."""
    wanted = torch.sym_min(torch.sym_min((TARGET_PROGRAMS + num_rows - 1) // num_rows, MAX_SPLITS),
                           (vocab + MIN_CHUNK - 1) // MIN_CHUNK)
    per_split = (vocab + wanted - 1) // wanted
    chunk = (per_split + BLOCK - 1) // BLOCK * BLOCK
    return (vocab + chunk - 1) // chunk, chunk


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
    splits, chunk = split_rows(num_rows, vocab)
    device = logits.device
    row_max = torch.empty(num_rows, splits, dtype=torch.float32, device=device)             # per chunk
    bounds = torch.empty(num_rows, 2 * PASSES, 2, dtype=torch.int32, device=device)         # each pass's [lo, hi]
    sums = torch.empty(num_rows, 2 * PASSES, splits, PIVOTS, dtype=torch.float64, device=device)   # per pivot
    consts = dict(BLOCK=BLOCK, P=PIVOTS, PASSES=PASSES, MAX_SPLITS=MAX_SPLITS, NEG_KEY=NEG_INF_KEY,
                  POS_KEY=POS_INF_KEY, num_warps=8)
    for step in range(2 * PASSES):
        wrap_triton(search_pass_kernel)[(num_rows, splits)](
            logits, top_k, top_p, min_p, row_max, bounds, sums, logits.stride(0), vocab, chunk, splits, step,
            NUCLEUS=step >= PASSES, **consts)
    out = torch.empty(num_rows, dtype=torch.float32, device=device)
    wrap_triton(threshold_kernel)[(num_rows,)](
        top_k, top_p, min_p, row_max, bounds, sums, out, vocab, splits, P=PIVOTS, PASSES=PASSES,
        MAX_SPLITS=MAX_SPLITS, NEG_KEY=NEG_INF_KEY, num_warps=4)
    return out


@triton_op("atom_triton::sampling_threshold", mutates_args=())
def sampling_threshold(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       min_p: torch.Tensor) -> torch.Tensor:
    return launch_sampling_threshold(logits, top_k, top_p, min_p)
