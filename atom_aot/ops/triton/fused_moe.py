"""`atom_triton::fused_moe`: the `atom::fused_moe` contract (atom_aot/ops/moe.py) as grouped GEMMs.

Four steps, none of which reads a tensor value on the host (so a CUDA graph captures the call):

1. sort: the T*k (token, slot) assignments sorted by expert (stably: a counting sort, one program
   per expert, `sort_by_expert_kernel`), and each expert's first sorted position ([E + 1]); ids < 0
   sort after every expert and are never read.
2. gate_up: program (m, n) finds its expert and its BLOCK_M rows of that expert's sorted
   assignments from the per-expert counts (`_expert_tile`: no padded index buffer), gathers the
   rows' tokens, multiplies by the expert's gate and up rows of w13 and writes SiLU(gate) * up
   into `inter [T*k, I]` at the sorted positions.
3. down: the same tiling over `inter` times the expert's w2, scaled by the routing weight, written
   to `per_slot [T*k, H]` at the assignment's own row (token * k + slot).
4. combine: out[t] = sum over slots of per_slot in float32 (slots with id < 0 skipped), cast (torch,
   slot by slot: Inductor compiles it into one pointwise kernel, `combine_slots`).

FP8 experts (e4m3 w13 / w2 with per-row scales, ops/moe.py): each weight tile is widened to the
activations' dtype in registers (exact) and the tile's fp32 products are scaled by their rows' scales
once, after the K loop (a row scale factors out of the sum): half the weight bytes, the same MMAs.
With 128x128 block scales (SCALES == BLOCK_SCALES) the experts are W8A8, as the block-scaled linears are
(ops/fp8.py; vLLM's and DeepSeek's own fp8 inference alike): the tokens and the SiLU-mul output are quantized
per token and 1x128 group (torch, in the op's body: Inductor fuses it) and each K step is an e4m3 x e4m3 MMA,
its fp32 product scaled by the rows' group scales and the block's scale before it is added (BLOCK_K divides
128, so a step stays inside one group and one block). MXFP4 experts (SCALES == MXFP4_SCALES: uint8 stacks
of two e2m1 values a byte, an e8m0 scale per 32 along K) load each step's packed bytes and scales and widen them to
the exact bf16 weight in registers (ops/triton/mxfp4_tiles.py); the dot is bf16's with fp32 accumulation (BLOCK_K a
multiple of 32). Expert biases (HAS_BIAS, float32) are added to the fp32 products: gate and up's before SiLU-mul,
down's before the routing weight.

Biases (HAS_BIAS; GPT-OSS) are added to the tile's fp32 gate and up columns before the activation, and to the
down tile before the routing weight; the activation (ACTIVATION: SiLU, or GPT-OSS's clamped SwiGLU with its alpha
and limit) is computed on the fp32 tile, as the reference computes it on each expert's rows (ops/moe.py).

Each expert has ceil(count / BLOCK_M) row tiles, so the tiles number at most
min(T*k, cdiv(T*k + E*(BLOCK_M - 1), BLOCK_M)): the grid's static bound; programs past the last tile return.

Launch configs come per token-count bucket as a flat int table (atom_aot/ops/backends/moe.py): each
bucket's kernels are launched with a grid of 0 unless T falls in the bucket (an expression of T,
never a guard), so one exported graph carries every bucket's config and runs the right one for
each batch; Triton's launcher and AOTInductor's wrapper skip empty grids.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.expert_formats import format_of
from atom_aot.ops.fp8 import BLOCK as FP8_BLOCK, quantize_activations
from atom_aot.ops.moe import ACTIVATIONS, ExpertActivation
from atom_aot.ops.mxfp4 import BLOCK as MXFP4_BLOCK, check_mxfp4_shapes
from atom_aot.ops.triton._common import bucket_rows, check_last_dim_contiguous, dot_acc, in_bucket, next_pow2
from atom_aot.ops.triton.mxfp4_tiles import mxfp4_tile

# The kernels' SCALES modes: how (whether) the expert weights are scaled.
NO_SCALES = tl.constexpr(0)        # bf16 / fp32 experts
ROW_SCALES = tl.constexpr(1)       # e4m3 experts, one scale per weight row
BLOCK_SCALES = tl.constexpr(2)     # e4m3 experts, one scale per 128x128 block
MXFP4_SCALES = tl.constexpr(3)     # mxfp4 experts: packed e2m1, one e8m0 scale per 32 along K
SCALE_MODES = {"none": NO_SCALES.value, "row": ROW_SCALES.value, "block": BLOCK_SCALES.value,
               "mxfp4": MXFP4_SCALES.value}      # ops/expert_formats.py ExpertFormat.scale -> SCALES
# The ACTIVATION mode is the index of ExpertActivation.kind in ops/moe.py ACTIVATIONS (0: SiLU(gate) * up).
SWIGLU_CLAMPED = tl.constexpr(ACTIVATIONS.index("swiglu_clamped"))


@dataclass(frozen=True)
class MoEConfig:
    block_m: int        # sorted assignments per tile (all of one expert)
    block_n: int        # output columns per tile
    block_k: int        # reduction step
    group_m: int        # row tiles per L2 group (program order swizzle)
    num_warps: int
    num_stages: int

    def as_args(self) -> tuple[int, int, int, int, int, int]:
        return (self.block_m, self.block_n, self.block_k, self.group_m, self.num_warps, self.num_stages)


# What the build measures per token-count bucket on the model's shapes (winner -> tuning.json).
# Small batches want short row tiles (few assignments per expert), large ones long tiles and wide N.
CANDIDATE_CONFIGS = (
    MoEConfig(16, 32, 64, 1, 4, 3), MoEConfig(16, 64, 64, 1, 4, 3), MoEConfig(16, 64, 128, 1, 4, 4),
    MoEConfig(16, 128, 64, 1, 4, 3), MoEConfig(32, 64, 64, 8, 4, 3), MoEConfig(64, 64, 64, 8, 4, 3),
    MoEConfig(64, 128, 64, 8, 4, 3), MoEConfig(64, 128, 64, 8, 8, 4), MoEConfig(128, 128, 64, 8, 8, 3),
    MoEConfig(128, 64, 64, 8, 4, 4),
    # small token counts read every expert's weights once: deeper K tiles and more stages keep more bytes
    # in flight (shared memory per stage: (BLOCK_M + 2 * BLOCK_N) * BLOCK_K bf16, at most ~160 KiB here)
    MoEConfig(16, 64, 128, 1, 4, 5), MoEConfig(32, 64, 128, 1, 4, 4), MoEConfig(16, 64, 256, 1, 4, 2),
    MoEConfig(16, 128, 128, 1, 8, 2),
)
DEFAULT_CONFIG = MoEConfig(64, 64, 64, 8, 4, 3)
# the first token count of each bucket the build tunes: decode batches, then prefill (512 and up)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TABLE_ROW = 1 + len(DEFAULT_CONFIG.as_args())     # first token count, then the config's ints


@triton.jit
def _expert_tile(offsets_ptr, pid_m, E: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row tile `pid_m` -> (expert, first row, end row) in sorted order; expert == E: past the last tile."""
    lanes = tl.arange(0, E_PAD)
    start = tl.load(offsets_ptr + lanes, mask=lanes < E, other=0)
    end = tl.load(offsets_ptr + lanes + 1, mask=lanes < E, other=0)
    tiles = (end - start + BLOCK_M - 1) // BLOCK_M                  # [E_PAD] row tiles per expert
    tiles_before = tl.cumsum(tiles, 0) - tiles                      # [E_PAD] exclusive prefix sum
    expert = tl.sum((tiles_before + tiles <= pid_m).to(tl.int32), 0)   # experts whose tiles all precede
    mine = lanes == expert
    first = tl.sum(tl.where(mine, start + (pid_m - tiles_before) * BLOCK_M, 0), 0)
    return expert, first, tl.sum(tl.where(mine, end, 0), 0)


@triton.jit
def _swizzle(num_m_tiles, N, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) with GROUP_M row tiles walked together, so their weight columns stay in L2."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m_tiles - first_m, GROUP_M)
    local = pid % (GROUP_M * num_n)
    return first_m + local % size_m, local // size_m


@triton.jit
def _tile(offsets_ptr, num_m_tiles, N, E: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's tile: (expert, rows [BLOCK_M] sorted positions, their mask, cols [BLOCK_N], their mask)."""
    pid_m, pid_n = _swizzle(num_m_tiles, N, BLOCK_N, GROUP_M)
    expert, first, end = _expert_tile(offsets_ptr, pid_m, E, E_PAD, BLOCK_M)
    rows = first + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return expert, rows, rows < end, cols, cols < N


@triton.jit
def _activate(gate, up, alpha, limit, ACTIVATION: tl.constexpr):
    """The fp32 tiles' activation: SiLU(gate) * up, or (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g) with
    g = min(gate, limit)."""
    if ACTIVATION == SWIGLU_CLAMPED:
        limit = tl.cast(limit, tl.float32)
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        return (up + 1.0) * (gate * tl.sigmoid(gate * tl.cast(alpha, tl.float32)))
    return gate * tl.sigmoid(gate) * up


@triton.jit
def moe_gate_up_kernel(
    x_ptr, w13_ptr, inter_ptr, order_ptr, offsets_ptr, scale_ptr, bias_ptr, x_scale_ptr, num_m_tiles, N, K, top_k,
    alpha, limit, stride_xt, stride_we, stride_wn, stride_it, stride_se, stride_sn, stride_be, stride_xst,
    E: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, IEEE: tl.constexpr, SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    """inter[r, n] = act(x[tok(r)] . w13[e, n] (+ b13[e, n]), x[tok(r)] . w13[e, N + n] (+ b13[e, N + n])) for the
    tile's rows r of expert e."""
    expert, rows, row_ok, cols, col_ok = _tile(offsets_ptr, num_m_tiles, N, E, E_PAD, BLOCK_M, BLOCK_N, GROUP_M)
    if expert >= E:
        return
    tokens = tl.load(order_ptr + rows, mask=row_ok, other=0) // top_k
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tokens.to(tl.int64)[:, None] * stride_xt + ks[None, :]                     # [BLOCK_M, BLOCK_K]
    w_e, s_e = w13_ptr + expert.to(tl.int64) * stride_we, scale_ptr + expert.to(tl.int64) * stride_se
    g_ptrs = w_e + cols[None, :] * stride_wn + ks[:, None]                                       # [BLOCK_K, BLOCK_N]
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = ks + k0 < K
        a = tl.load(a_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if SCALES == MXFP4_SCALES:     # packed bytes and e8m0 scales, widened to bf16 in registers
            g = mxfp4_tile(w_e, s_e, cols, col_ok, k0, K, stride_wn, stride_sn, IEEE, BLOCK_K, BLOCK_N)
            u = mxfp4_tile(w_e, s_e, N + cols, col_ok, k0, K, stride_wn, stride_sn, IEEE, BLOCK_K, BLOCK_N)
        else:
            g = tl.load(g_ptrs + k0, mask=k_ok[:, None] & col_ok[None, :], other=0.0).to(a.dtype)
            u = tl.load(g_ptrs + N * stride_wn + k0, mask=k_ok[:, None] & col_ok[None, :], other=0.0).to(a.dtype)
        if SCALES == BLOCK_SCALES:     # e4m3 x e4m3; this K step's group scales per row, block scales per column
            s_x = tl.load(x_scale_ptr + tokens.to(tl.int64) * stride_xst + k0 // 128, mask=row_ok, other=0.0)
            blocks = scale_ptr + expert.to(tl.int64) * stride_se + k0 // 128
            s_gate = tl.load(blocks + (cols // 128) * stride_sn, mask=col_ok, other=0.0)
            s_up = tl.load(blocks + ((N + cols) // 128) * stride_sn, mask=col_ok, other=0.0)
            gate += dot_acc(a, g, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), IEEE) * s_x[:, None] * s_gate[None, :]
            up += dot_acc(a, u, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), IEEE) * s_x[:, None] * s_up[None, :]
        else:
            gate = dot_acc(a, g, gate, IEEE)
            up = dot_acc(a, u, up, IEEE)
    if SCALES == ROW_SCALES:       # the rows' scales, once per tile
        gate = gate * tl.load(s_e + cols, mask=col_ok, other=0.0)[None, :]
        up = up * tl.load(s_e + N + cols, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        biases = bias_ptr + expert.to(tl.int64) * stride_be + cols
        gate += tl.load(biases, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        up += tl.load(biases + N, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    h = _activate(gate, up, alpha, limit, ACTIVATION)
    tl.store(inter_ptr + rows.to(tl.int64)[:, None] * stride_it + cols[None, :],
             h.to(inter_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def moe_down_kernel(
    inter_ptr, w2_ptr, out_ptr, order_ptr, offsets_ptr, weights_ptr, scale_ptr, bias_ptr, inter_scale_ptr,
    num_m_tiles, N, K, stride_it, stride_we, stride_wn, stride_ot, stride_se, stride_sn, stride_be, stride_ist,
    E: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, IEEE: tl.constexpr, SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    """per_slot[a(r), n] = weight[a(r)] * (inter[r] . w2[e, n] (+ b2[e, n])) for the tile's rows r, a(r) their
    assignment."""
    expert, rows, row_ok, cols, col_ok = _tile(offsets_ptr, num_m_tiles, N, E, E_PAD, BLOCK_M, BLOCK_N, GROUP_M)
    if expert >= E:
        return
    assignment = tl.load(order_ptr + rows, mask=row_ok, other=0)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = inter_ptr + rows.to(tl.int64)[:, None] * stride_it + ks[None, :]
    w_e, s_e = w2_ptr + expert.to(tl.int64) * stride_we, scale_ptr + expert.to(tl.int64) * stride_se
    b_ptrs = w_e + cols[None, :] * stride_wn + ks[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = ks + k0 < K
        a = tl.load(a_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if SCALES == MXFP4_SCALES:
            b = mxfp4_tile(w_e, s_e, cols, col_ok, k0, K, stride_wn, stride_sn, IEEE, BLOCK_K, BLOCK_N)
        else:
            b = tl.load(b_ptrs + k0, mask=k_ok[:, None] & col_ok[None, :], other=0.0).to(a.dtype)
        if SCALES == BLOCK_SCALES:
            s_a = tl.load(inter_scale_ptr + rows.to(tl.int64) * stride_ist + k0 // 128, mask=row_ok, other=0.0)
            s = tl.load(s_e + (cols // 128) * stride_sn + k0 // 128, mask=col_ok, other=0.0)
            acc += dot_acc(a, b, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), IEEE) * s_a[:, None] * s[None, :]
        else:
            acc = dot_acc(a, b, acc, IEEE)
    if SCALES == ROW_SCALES:
        acc = acc * tl.load(s_e + cols, mask=col_ok, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert.to(tl.int64) * stride_be + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    weight = tl.load(weights_ptr + assignment, mask=row_ok, other=0.0)   # float32
    tl.store(out_ptr + assignment.to(tl.int64)[:, None] * stride_ot + cols[None, :],
             (acc * weight[:, None]).to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def sort_by_expert_kernel(ids_ptr, order_ptr, offsets_ptr, num_slots, E: tl.constexpr, BLOCK: tl.constexpr):
    """Program e (0..E; E: the ids < 0) places expert e's assignments, in their own order, after every assignment
    of a lower expert: offsets[e] = how many those are; order[offsets[e] + j] = e's j-th assignment."""
    e = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    before = tl.full((), 0, tl.int32)
    for start in range(0, num_slots, BLOCK):
        index = start + lanes
        ids = tl.load(ids_ptr + index, mask=index < num_slots, other=E)
        before += tl.sum(((tl.where(ids < 0, E, ids) < e) & (index < num_slots)).to(tl.int32), 0)
    tl.store(offsets_ptr + e, before)
    placed = before
    for start in range(0, num_slots, BLOCK):
        index = start + lanes
        ids = tl.load(ids_ptr + index, mask=index < num_slots, other=-1)
        mine = (tl.where(ids < 0, E, ids) == e) & (index < num_slots)
        count = mine.to(tl.int32)
        tl.store(order_ptr + placed + tl.cumsum(count, 0) - 1, index, mask=mine)
        placed += tl.sum(count, 0)


SORT_BLOCK = 1024          # assignments one program reads per step


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order [T*k] int32: assignment indices sorted by expert, stably; offsets [E + 1] int32: each expert's first
    sorted position, offsets[E] = assignments on this rank). Ids < 0 sort last, past offsets[E].

    A counting sort, one program per expert reading every id (E + 1 programs over T*k ints, from L2): torch's
    stable sort (a radix sort) and searchsorted took 22 us per layer at 256 tokens x 8 of 128 experts (Qwen3-30B-A3B
    at -tp 2, four H200s, profiled)."""
    flat = topk_ids.flatten()
    order = torch.empty(flat.numel(), dtype=torch.int32, device=flat.device)
    offsets = torch.empty(num_experts + 1, dtype=torch.int32, device=flat.device)
    wrap_triton(sort_by_expert_kernel)[(num_experts + 1,)](flat, order, offsets, flat.numel(), E=num_experts,
                                                           BLOCK=SORT_BLOCK, num_warps=4)
    return order, offsets


def check_config(config: MoEConfig) -> None:
    if min(config.block_m, config.block_n, config.block_k) < 16 or config.group_m < 1:
        raise ValueError(f"block_m, block_n, block_k must be >= 16 (tl.dot) and group_m >= 1, got {config}")


def table_buckets(table: list[int]) -> list[tuple[int, int | None, MoEConfig]]:
    """The flat table as (first token count, next bucket's first or None, config), adjacent equal configs merged."""
    buckets = [(first, nxt, MoEConfig(*ints)) for first, nxt, ints in bucket_rows(table, TABLE_ROW, "fused_moe")]
    for _, _, config in buckets:
        check_config(config)
    return buckets


def launch_fused_moe(
    hidden: torch.Tensor,         # [T, H]
    w13: torch.Tensor,            # [E, 2I, H] (mxfp4: [E, 2I, H/2] uint8)
    w2: torch.Tensor,             # [E, H, I] (mxfp4: [E, H, I/2] uint8)
    topk_weights: torch.Tensor,   # [T, k] float32
    topk_ids: torch.Tensor,       # [T, k] int32, < 0: not on this rank
    table: list[int],             # per bucket: first token count, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages
    w13_scale: torch.Tensor | None = None,   # [E, 2I] (rows) or [E, 2I/128, H/128] (blocks) float32 when w13 is e4m3
                                             # (or its format's: expert_formats.py)
    w2_scale: torch.Tensor | None = None,    # [E, H] or [E, H/128, I/128] float32 when w2 is e4m3
    w13_bias: torch.Tensor | None = None,    # [E, 2I] float32
    w2_bias: torch.Tensor | None = None,     # [E, H] float32
    activation: ExpertActivation = ExpertActivation(),
) -> torch.Tensor:
    for name, t in (("hidden", hidden), ("w13", w13), ("w2", w2)):
        check_last_dim_contiguous(name, t)
    num_tokens, hidden_size = hidden.shape
    num_experts, two_inter, _ = w13.shape
    inter_size, top_k = two_inter // 2, topk_ids.shape[1]
    (s13, s2), scales = _scale_operands(hidden, w13, w2, w13_scale, w2_scale, inter_size)
    (b13, b2), has_bias = _bias_operands(w13, w2, w13_bias, w2_bias)
    num_slots = num_tokens * top_k
    order, offsets = sort_by_expert(topk_ids, num_experts)
    weights = topk_weights.to(torch.float32).contiguous().view(-1)                  # [T*k]
    inter = torch.empty((num_slots, inter_size), dtype=hidden.dtype, device=hidden.device)
    per_slot = torch.empty((num_slots, hidden_size), dtype=hidden.dtype, device=hidden.device)
    w8a8 = scales == BLOCK_SCALES.value
    x, x_scale = quantize_activations(hidden, None, block_scaled=True) if w8a8 else (hidden, hidden)  # [T, H/128]
    common = dict(E=num_experts, E_PAD=next_pow2(num_experts), IEEE=hidden.dtype == torch.float32 and not w8a8,
                  SCALES=scales, HAS_BIAS=has_bias)
    strides = [(s.stride(0), s.stride(1) if scales in (BLOCK_SCALES.value, MXFP4_SCALES.value) else 0, b.stride(0))
               for s, b in ((s13, b13), (s2, b2))]
    buckets = []
    for first, next_first, c in table_buckets(table):
        _check_steps(scales, c)
        num_m_tiles = torch.sym_min(num_slots, (num_slots + num_experts * (c.block_m - 1) + c.block_m - 1) // c.block_m)
        tiles = dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
                     num_warps=c.num_warps, num_stages=c.num_stages, **common)
        buckets.append((in_bucket(num_tokens, first, next_first), num_m_tiles, c, tiles))
    for active, num_m_tiles, c, tiles in buckets:      # every gate_up first: the downs' inputs are quantized once
        wrap_triton(moe_gate_up_kernel)[(active * num_m_tiles * triton.cdiv(inter_size, c.block_n),)](
            x, w13, inter, order, offsets, s13, b13, x_scale, num_m_tiles, inter_size, hidden_size, top_k,
            activation.alpha, activation.limit, x.stride(0), w13.stride(0), w13.stride(1), inter.stride(0), *strides[0],
            x_scale.stride(0), ACTIVATION=ACTIVATIONS.index(activation.kind), **tiles)
    a, a_scale = quantize_activations(inter, None, block_scaled=True) if w8a8 else (inter, inter)   # [T*k, I/128]
    for active, num_m_tiles, c, tiles in buckets:
        wrap_triton(moe_down_kernel)[(active * num_m_tiles * triton.cdiv(hidden_size, c.block_n),)](
            a, w2, per_slot, order, offsets, weights, s2, b2, a_scale, num_m_tiles, hidden_size, inter_size,
            a.stride(0), w2.stride(0), w2.stride(1), per_slot.stride(0), *strides[1], a_scale.stride(0), **tiles)
    return combine_slots(per_slot.view(num_tokens, top_k, hidden_size), topk_ids).to(hidden.dtype)


def _scale_operands(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor | None,
                    w2_scale: torch.Tensor | None, inter_size: int) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
    """The kernels' (w13 scales, w2 scales) (the weights themselves where there are none: never read) and SCALES
    mode, after the checks of the experts' format."""
    if (w13_scale is None) != (w2_scale is None):
        raise ValueError("fused_moe: w13_scale and w2_scale come together (quantized experts) or not at all")
    expert_format = format_of(w13, w13_scale)
    if expert_format.name == "mxfp4":
        check_mxfp4_shapes(w13, w13_scale)
        check_mxfp4_shapes(w2, w2_scale)
        if hidden.dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"fused_moe: mxfp4 experts are widened to bf16 (float32 for tests), and the "
                             f"activations are {hidden.dtype}")
        if w13.shape[2] * 2 != hidden.shape[1] or w2.shape[2] * 2 != inter_size or inter_size % MXFP4_BLOCK:
            raise ValueError(f"fused_moe: mxfp4 stacks w13 [E, 2I, H/2] {tuple(w13.shape)} and w2 [E, H, I/2] "
                             f"{tuple(w2.shape)} do not fit hidden {tuple(hidden.shape)} (I a multiple of 32)")
    if w13_scale is None:
        return (w13, w2), NO_SCALES.value
    return (w13_scale.contiguous(), w2_scale.contiguous()), SCALE_MODES[expert_format.scale]


def _bias_operands(w13: torch.Tensor, w2: torch.Tensor, w13_bias: torch.Tensor | None,
                   w2_bias: torch.Tensor | None) -> tuple[tuple[torch.Tensor, torch.Tensor], bool]:
    """The kernels' float32 (w13 biases, w2 biases) (the weights where there are none: never read) and HAS_BIAS."""
    if (w13_bias is None) != (w2_bias is None):
        raise ValueError("fused_moe: w13_bias and w2_bias come together or not at all")
    if w13_bias is None:
        return (w13, w2), False
    return (w13_bias.float().contiguous(), w2_bias.float().contiguous()), True


def _check_steps(scales: int, c: MoEConfig) -> None:
    """A K step must stay inside one scale block (fp8 128x128) or cover whole ones (mxfp4's 32)."""
    if scales == BLOCK_SCALES.value and FP8_BLOCK % c.block_k:
        raise ValueError(f"fused_moe: block-scaled experts need BLOCK_K dividing 128 (a K step inside one "
                         f"scale block), got {c}")
    if scales == MXFP4_SCALES.value and c.block_k % MXFP4_BLOCK:
        raise ValueError(f"fused_moe: mxfp4 experts need BLOCK_K a multiple of {MXFP4_BLOCK} (whole scale "
                         f"groups per K step), got {c}")


def combine_slots(per_slot: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """out[t] = the sum of token t's slots in float32, slot by slot in order, skipping slots with id < 0.

    Written as k adds, not one sum over the slot axis: Inductor compiles the adds into one pointwise kernel whose k
    loads each run along the hidden axis, where it compiled the sum as a reduction over the strided slot axis, read
    across the rows: 41 us per layer at 256 tokens x 8 slots x 2048 (Qwen3-30B-A3B at -tp 2, four H200s,
    profiled), a tenth of that step's GPU time, for 9 MB moved; 3.6 us written this way."""
    total = None
    for slot in range(topk_ids.shape[1]):
        term = torch.where((topk_ids[:, slot] >= 0).unsqueeze(-1), per_slot[:, slot].float(), 0.0)
        total = term if total is None else total + term
    return total


@triton_op("atom_triton::fused_moe", mutates_args=())
def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, table: list[int], w13_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None, w13_bias: torch.Tensor | None = None,
              w2_bias: torch.Tensor | None = None, activation: str = "silu", alpha: float = 1.0,
              limit: float = 0.0) -> torch.Tensor:
    return launch_fused_moe(hidden, w13, w2, topk_weights, topk_ids, table, w13_scale, w2_scale, w13_bias, w2_bias,
                            ExpertActivation(activation, alpha, limit))
