"""The tensor-parallel all-reduce fused with the residual add and RMSNorm that follow it: one kernel.

Why: a tensor-parallel layer all-reduces its attention and MLP outputs, and each sum goes straight into
`residual += sum; normed = rms_norm(residual)`. At decode batch sizes the all-reduce is a few KiB, all
latency, and the add + norm is one more launch of the same few KiB; over 64 all-reduces per Llama-3.1-8B
token that pair of launches is most of what tensor parallelism adds to a step. Here one kernel stages this
rank's partial sums in its peer-mapped buffer, meets the other ranks, reads every rank's copy (NVLink peer
loads: never multicast), sums them in rank order in float32 (so every rank holds the same bits), adds the
residual and normalizes, as Hugging Face's RMSNorm does (float32 statistics, cast back, then scale).

Where the ranks share no peer memory (ATOM_ALL_REDUCE=nccl, ranks on several hosts, the build's stand-in)
or the message is larger than the buffer's slabs, the graph's all-reduce before it (atom::all_reduce_unless_fused,
distributed/collectives.py) has already summed the message and this kernel only adds and normalizes. Both
sides take the same rule, `peer_path_taken`, from the same numbers (the peer table below).

The peer table (distributed/peer_table.py: each rank's buffer and signal pad addresses; a constant of the
compiled model that the runtime fills at start) says where the peers are, or that there are none. The kernel always runs PROGRAMS programs when a message may take the peer
path; program p handles rows p, p + PROGRAMS, ... and stages them in its own slab, so every region of a buffer is
only ever written and read by program p of each rank. Each call alternates between two halves of the buffer
(by the program's count of calls, kept in its rank's own signal pad), so a rank can start the next call while
a slower peer still reads the last: it writes the other half, and it can only come back to this one after
that peer has met it again. Meeting = each program stores a new value into its slot of every peer's pad
(release, system scope) and waits until every peer's slot in its own pad has reached it (acquire); call c's
meetings are at 2c + 1 and 2c + 2, so the values only grow whichever way each call sums.

Two ways to sum, by the table's two_shot_rows (peer_table.two_shot_taken, the same on every rank):
- one-shot: meet once (2c + 2), then every rank reads every rank's copy of all the program's rows, two rows at a
  time (both rows' loads in flight together). Fewest steps; each rank reads W - 1 remote copies of every row,
  which dominates from a few rows per program.
- two-shot: meet (2c + 1); each rank sums its share of the program's rows (rows i with i % W == rank), adds
  the residual and writes the result over its own staged copy of those rows (no other rank reads them); meet
  (2c + 2); every rank reads each row's result from the rank that summed it. Each rank reads about 2 (W - 1) / W
  rows' worth remotely per row instead of W - 1 (torch's and vLLM's two-shot all-reduces, with the add in the
  middle). Both give the same bits: the same rank-order float32 sum, rounding, residual add and norm.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.distributed.peer_table import (BUFFERS, MAX_RANKS, PROGRAMS, RANK, ROWS_PER_PROGRAM_MAX, SIGNALS,
                                             SLAB_BYTES, TABLE_SIZE, TWO_SHOT_ROWS)
from atom_aot.ops.triton._common import in_bucket, next_pow2


@triton.jit
def _with_residual(summed, residual_ptr, offsets, mask, dtype: tl.constexpr):
    """summed + residual in float32, rounded to the activations' dtype (the residual stream's next value)."""
    residual = tl.load(residual_ptr + offsets, mask=mask, other=0.0)
    return (summed.to(dtype).to(tl.float32) + residual.to(tl.float32)).to(dtype)


@triton.jit
def _store_normed(h, weight, out_ptr, residual_out_ptr, offsets, mask, hidden, eps):
    """residual_out = h; out = weight * rms_norm(h), in the activations' dtype."""
    dtype = out_ptr.dtype.element_ty
    tl.store(residual_out_ptr + offsets, h, mask=mask)
    hf = h.to(tl.float32)
    inverse_rms = tl.rsqrt(tl.sum(hf * hf, axis=0) / hidden + eps)
    normed = (hf * inverse_rms).to(dtype)
    tl.store(out_ptr + offsets, (weight * normed.to(tl.float32)).to(dtype), mask=mask)


@triton.jit
def _sum_ranks(table_ptr, slab, at, mask, BUFFERS_AT: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr,
               dtype: tl.constexpr):
    """Every rank's staged elements at `at` of this program's slab, summed in rank order in float32."""
    total = tl.zeros([BLOCK], dtype=tl.float32)
    for r in tl.static_range(WORLD):
        copy = tl.multiple_of(tl.load(table_ptr + BUFFERS_AT + r).to(tl.pointer_type(dtype)) + slab, 16)
        total += tl.load(copy + at, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    return total


@triton.jit
def _meet_peers(signal_table, program, rank, target, WORLD: tl.constexpr, WORLD_POW2: tl.constexpr):
    """Tell every peer this program's data is staged (count `target`), then wait until each has said the same."""
    tl.debug_barrier()                        # every thread's staging stores come before the signal
    peers = tl.arange(0, WORLD_POW2)
    others = (peers < WORLD) & (peers != rank)
    peer_pads = tl.load(signal_table + peers, mask=peers < WORLD, other=0).to(tl.pointer_type(tl.int64))
    tl.atomic_xchg(peer_pads + program * WORLD + rank, target, mask=others, sem="release", scope="sys")
    own_slots = tl.load(signal_table + rank).to(tl.pointer_type(tl.int64)) + program * WORLD
    for peer in tl.static_range(WORLD):
        if peer != rank:
            while tl.atomic_add(own_slots + peer, 0, sem="acquire", scope="sys") < target:
                pass
    tl.debug_barrier()                        # no thread reads a peer's rows before the wait is over


@triton.jit
def _one_shot_row(table_ptr, residual_ptr, weight, out_ptr, residual_out_ptr, slab, i, program, programs, n_rows,
                  hidden, eps, cols, inside, WORLD: tl.constexpr, BLOCK: tl.constexpr, BUFFERS_AT: tl.constexpr):
    """This program's row i, one-shot: every rank's copy summed, the residual added, normalized."""
    dtype = out_ptr.dtype.element_ty
    row = program + i * programs
    mask = inside & (row < n_rows)
    total = _sum_ranks(table_ptr, slab, i * hidden + cols, mask, BUFFERS_AT, WORLD, BLOCK, dtype)
    h = _with_residual(total, residual_ptr, row * hidden + cols, mask, dtype)
    _store_normed(h, weight, out_ptr, residual_out_ptr, row * hidden + cols, mask, hidden, eps)


@triton.jit
def _one_shot_pair(table_ptr, residual_ptr, weight, out_ptr, residual_out_ptr, slab, i, program, programs, n_rows,
                   hidden, eps, cols, inside, WORLD: tl.constexpr, BLOCK: tl.constexpr, BUFFERS_AT: tl.constexpr):
    """This program's rows i and i + 1, one-shot: both rows' peer loads go out before either row's norm reduces.
    A row at a time, each program's rows were a chain of remote round trips, each waiting for the last row's
    reduction: 27 us per call at 256 rows (4 per program) on four H200s, where the bytes take a fraction of that
    (four H200s)."""
    dtype = out_ptr.dtype.element_ty
    row = program + i * programs
    mask, next_mask = inside & (row < n_rows), inside & (row + programs < n_rows)
    total = _sum_ranks(table_ptr, slab, i * hidden + cols, mask, BUFFERS_AT, WORLD, BLOCK, dtype)
    next_total = _sum_ranks(table_ptr, slab, (i + 1) * hidden + cols, next_mask, BUFFERS_AT, WORLD, BLOCK, dtype)
    h = _with_residual(total, residual_ptr, row * hidden + cols, mask, dtype)
    next_h = _with_residual(next_total, residual_ptr, (row + programs) * hidden + cols, next_mask, dtype)
    _store_normed(h, weight, out_ptr, residual_out_ptr, row * hidden + cols, mask, hidden, eps)
    _store_normed(next_h, weight, out_ptr, residual_out_ptr, (row + programs) * hidden + cols, next_mask, hidden, eps)


@triton.jit
def _sum_two_shot(table_ptr, residual_ptr, weight, out_ptr, residual_out_ptr, staged, slab, signal_table, program,
                  programs, rank, count, per_program, n_rows, hidden, eps, cols, inside, WORLD: tl.constexpr,
                  WORLD_POW2: tl.constexpr, BLOCK: tl.constexpr, BUFFERS_AT: tl.constexpr):
    """The two-shot sum of this program's staged rows (module docstring). Call `count` meets at 2 count + 1 once
    every rank has staged its rows, at 2 count + 2 once each has summed its share (every WORLD-th row from its
    rank) over its own staged copy of those rows."""
    dtype = out_ptr.dtype.element_ty
    _meet_peers(signal_table, program, rank, 2 * count + 1, WORLD, WORLD_POW2)
    for i in range(rank, per_program, WORLD):
        row = program + i * programs
        mask = inside & (row < n_rows)
        total = _sum_ranks(table_ptr, slab, i * hidden + cols, mask, BUFFERS_AT, WORLD, BLOCK, dtype)
        h = _with_residual(total, residual_ptr, row * hidden + cols, mask, dtype)
        tl.store(staged + i * hidden + cols, h, mask=mask)     # only this rank read the rows it overwrites
    _meet_peers(signal_table, program, rank, 2 * count + 2, WORLD, WORLD_POW2)
    for i in range(0, per_program):
        row = program + i * programs
        mask = inside & (row < n_rows)
        owner = tl.load(table_ptr + BUFFERS_AT + i % WORLD).to(tl.pointer_type(dtype))
        h = tl.load(tl.multiple_of(owner + slab, 16) + i * hidden + cols, mask=mask, other=0.0, cache_modifier=".cg")
        _store_normed(h, weight, out_ptr, residual_out_ptr, row * hidden + cols, mask, hidden, eps)


@triton.jit
def all_reduce_add_rms_norm_kernel(x_ptr, reduced_ptr, residual_ptr, weight_ptr, table_ptr, out_ptr,
                                   residual_out_ptr, n_rows, hidden, eps, ELEMENT_BYTES: tl.constexpr,
                                   WORLD: tl.constexpr, WORLD_POW2: tl.constexpr, BLOCK: tl.constexpr,
                                   PEER_PROGRAMS: tl.constexpr, ROWS_MAX: tl.constexpr, RANK_AT: tl.constexpr,
                                   SLAB_BYTES_AT: tl.constexpr, BUFFERS_AT: tl.constexpr,
                                   SIGNALS_AT: tl.constexpr, TWO_SHOT_ROWS_AT: tl.constexpr):
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < hidden
    dtype = out_ptr.dtype.element_ty
    weight = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    slab_bytes = tl.load(table_ptr + SLAB_BYTES_AT)
    per_program = tl.cdiv(n_rows, PEER_PROGRAMS)
    # peer_path_taken's rule; the grid is PEER_PROGRAMS whenever it can hold
    row_bytes = hidden * ELEMENT_BYTES
    if (slab_bytes > 0) & (row_bytes % 16 == 0) & (per_program <= ROWS_MAX) & (per_program * row_bytes <= slab_bytes):
        rank = tl.load(table_ptr + RANK_AT).to(tl.int32)
        two_shot_rows = tl.load(table_ptr + TWO_SHOT_ROWS_AT)
        two_shot = (two_shot_rows > 0) & (per_program >= two_shot_rows)          # peer_table.two_shot_taken
        signal_table = table_ptr + SIGNALS_AT
        count_slot = tl.load(signal_table + rank).to(tl.pointer_type(tl.int64)) + program * WORLD + rank
        count = tl.load(count_slot)           # this program's calls so far (no peer writes this slot)
        slab = ((count % 2) * programs + program) * (slab_bytes // ELEMENT_BYTES)       # in elements
        staged = tl.multiple_of(tl.load(table_ptr + BUFFERS_AT + rank).to(tl.pointer_type(dtype)) + slab, 16)
        for i in range(0, per_program):
            row = program + i * programs
            mask = inside & (row < n_rows)
            tl.store(staged + i * hidden + cols, tl.load(x_ptr + row * hidden + cols, mask=mask), mask=mask)
        if two_shot:
            _sum_two_shot(table_ptr, residual_ptr, weight, out_ptr, residual_out_ptr, staged, slab, signal_table,
                          program, programs, rank, count, per_program, n_rows, hidden, eps, cols, inside,
                          WORLD, WORLD_POW2, BLOCK, BUFFERS_AT)
        else:
            _meet_peers(signal_table, program, rank, 2 * count + 2, WORLD, WORLD_POW2)
            for i in range(0, per_program - 1, 2):
                _one_shot_pair(table_ptr, residual_ptr, weight, out_ptr, residual_out_ptr, slab, i, program, programs,
                               n_rows, hidden, eps, cols, inside, WORLD, BLOCK, BUFFERS_AT)
            if per_program % 2 == 1:
                _one_shot_row(table_ptr, residual_ptr, weight, out_ptr, residual_out_ptr, slab, per_program - 1,
                              program, programs, n_rows, hidden, eps, cols, inside, WORLD, BLOCK, BUFFERS_AT)
        tl.store(count_slot, count + 1)
    else:
        for row in range(program, n_rows, programs):
            summed = tl.load(reduced_ptr + row * hidden + cols, mask=inside, other=0.0)
            h = _with_residual(summed, residual_ptr, row * hidden + cols, inside, dtype)
            _store_normed(h, weight, out_ptr, residual_out_ptr, row * hidden + cols, inside, hidden, eps)


def _programs(rows):
    """PROGRAMS while the message may take the peer path, else one per row; on a SymInt an expression of it,
    never a guard (the mixed phase exports one graph for every token count)."""
    many = in_bucket(rows, PROGRAMS * ROWS_PER_PROGRAM_MAX + 1, None)
    return PROGRAMS + many * (rows - PROGRAMS)


def _num_warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def launch_all_reduce_add_rms_norm(x: torch.Tensor, reduced: torch.Tensor, residual: torch.Tensor,
                                   weight: torch.Tensor, peers: torch.Tensor, eps: float,
                                   world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() != 2 or reduced.shape != x.shape or residual.shape != x.shape or weight.shape != x.shape[1:]:
        raise ValueError(f"all_reduce_add_rms_norm wants x, reduced, residual [T, hidden] and weight [hidden], got "
                         f"{tuple(x.shape)}, {tuple(reduced.shape)}, {tuple(residual.shape)}, {tuple(weight.shape)}")
    if len({x.dtype, reduced.dtype, residual.dtype, weight.dtype}) != 1:
        raise ValueError(f"all_reduce_add_rms_norm wants one dtype, got x {x.dtype}, reduced {reduced.dtype}, "
                         f"residual {residual.dtype}, weight {weight.dtype}")
    if peers.shape != (TABLE_SIZE,) or peers.dtype != torch.int64 or not 1 < world_size <= MAX_RANKS:
        raise ValueError(f"all_reduce_add_rms_norm wants an int64 peer table of {TABLE_SIZE} and 2-{MAX_RANKS} ranks, "
                         f"got {peers.dtype} {tuple(peers.shape)} and {world_size}")
    x, reduced, residual = x.contiguous(), reduced.contiguous(), residual.contiguous()
    rows, hidden = x.shape
    out, residual_out = torch.empty_like(x), torch.empty_like(x)
    block = next_pow2(hidden)
    wrap_triton(all_reduce_add_rms_norm_kernel)[(_programs(rows),)](
        x, reduced, residual, weight, peers, out, residual_out, rows, hidden, eps,
        ELEMENT_BYTES=x.element_size(), WORLD=world_size, WORLD_POW2=next_pow2(world_size), BLOCK=block,
        PEER_PROGRAMS=PROGRAMS, ROWS_MAX=ROWS_PER_PROGRAM_MAX, RANK_AT=RANK, SLAB_BYTES_AT=SLAB_BYTES,
        BUFFERS_AT=BUFFERS, SIGNALS_AT=SIGNALS, TWO_SHOT_ROWS_AT=TWO_SHOT_ROWS, num_warps=_num_warps(block))
    return out, residual_out


@triton_op("atom_triton::all_reduce_add_rms_norm", mutates_args=())
def all_reduce_add_rms_norm(x: torch.Tensor, reduced: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            peers: torch.Tensor, eps: float, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * rms_norm(residual + sum over ranks of x), residual + that sum), [T, hidden] each. `x`: this
    rank's partial sums; `reduced`: their sum already (read where the peer path is not taken; see the module
    docstring); `peers`: the peer table (distributed/peer_table.py) of these `world_size` ranks."""
    return launch_all_reduce_add_rms_norm(x, reduced, residual, weight, peers, eps, world_size)
