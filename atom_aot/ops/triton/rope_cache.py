"""`atom_triton::qk_norm_rope_cache_write`: QK-norm (Qwen3), rotary embedding and the KV-cache write, fused.
Rope turns the first R dims of each head (R: the cos/sin table's width; all of them but for partial
rotary, GLM-4-MoE).

One pass over q, k and v instead of four (norm q/k, rotate q/k, scatter k/v): each program owns
one token and BLOCK_H heads; programs 0 .. NQ-1 along axis 1 do q heads (normalize, rotate,
write q_out), the rest do kv heads (normalize and rotate k, copy v, both into the token's cache
slot unless the slot is -1). Rounding follows the reference backend (atom_aot/ops/norm.py,
atom_aot/ops/rope.py) step by step (RMSNorm rounds to the model dtype before and after the
weight, rope computes in float32), so bf16 results match it bit for bit up to fp32 summation order.
With an fp8 cache's `kv_scale` (k, v) the stored rows are clamp(x / scale) in e4m3, as the reference stores them.
"""
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton._common import check_kv_cache, check_last_dim_contiguous, next_pow2


@dataclass(frozen=True)
class RopeCacheConfig:
    block_h: int = 4        # heads per program
    num_warps: int = 4

    def as_args(self) -> tuple[int, int]:
        return (self.block_h, self.num_warps)

    def as_dict(self) -> dict:
        return asdict(self)


CANDIDATE_CONFIGS = (RopeCacheConfig(1, 1), RopeCacheConfig(2, 2), RopeCacheConfig(4, 4), RopeCacheConfig(8, 4))
DEFAULT_CONFIG = RopeCacheConfig(4, 4)


@triton.jit
def _norm_rope(x_ptr, w_ptr, cos, sin, eps, heads, halves, ok, rest, rest_ok, HEAD_DIM: tl.constexpr,
               ROT_DIM: tl.constexpr, HAS_NORM: tl.constexpr):
    """Loads x [BLOCK_H, D] as the rotated part's two halves and the rest (partial rotary: dims ROT_DIM.., passed
    through), RMS-normalizes all three (optional) and rotates the halves; fp32 halves and the rest (x's dtype) out."""
    half: tl.constexpr = ROT_DIM // 2
    x1 = tl.load(x_ptr + heads + halves, mask=ok, other=0.0)
    x2 = tl.load(x_ptr + heads + halves + half, mask=ok, other=0.0)
    x3 = tl.load(x_ptr + heads + ROT_DIM + rest, mask=rest_ok, other=0.0)
    if HAS_NORM:
        f1, f2, f3 = x1.to(tl.float32), x2.to(tl.float32), x3.to(tl.float32)
        mean_sq = (tl.sum(f1 * f1, 1) + tl.sum(f2 * f2, 1) + tl.sum(f3 * f3, 1)) / HEAD_DIM
        inv = tl.rsqrt(mean_sq + tl.cast(eps, tl.float32))[:, None]   # Inductor passes floats as fp64
        w1 = tl.load(w_ptr + halves, mask=halves < half, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + halves + half, mask=halves < half, other=0.0).to(tl.float32)
        w3 = tl.load(w_ptr + ROT_DIM + rest, mask=rest < HEAD_DIM - ROT_DIM, other=0.0).to(tl.float32)
        x1 = (w1 * (f1 * inv).to(x1.dtype).to(tl.float32)).to(x1.dtype)
        x2 = (w2 * (f2 * inv).to(x2.dtype).to(tl.float32)).to(x2.dtype)
        x3 = (w3 * (f3 * inv).to(x3.dtype).to(tl.float32)).to(x3.dtype)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    return f1 * cos - f2 * sin, f2 * cos + f1 * sin, x3


@triton.jit
def _to_cache(x, scale_ptr, cache_dtype: tl.constexpr, SCALED: tl.constexpr, FP8_MAX: tl.constexpr):
    """x as the cache stores it: divided by *scale_ptr and clamped to the fp8 range when SCALED."""
    if SCALED:
        y = x.to(tl.float32) / tl.load(scale_ptr)
        return tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX).to(cache_dtype)
    return x.to(cache_dtype)


@triton.jit
def qk_norm_rope_cache_write_kernel(
    q_ptr, k_ptr, v_ptr, positions_ptr, cos_sin_ptr, q_norm_ptr, k_norm_ptr, q_out_ptr, kv_ptr, slot_ptr,
    kv_scale_ptr,                       # [2] float32 (k, v) when KV_SCALED
    eps, num_heads, num_kv_heads, layer_offset,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_cs,
    stride_ckv, stride_cblk, stride_crow, stride_ch,
    HEAD_DIM: tl.constexpr, ROT_DIM: tl.constexpr, HALF_PAD: tl.constexpr, REST_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, HAS_NORM: tl.constexpr, KV_SCALED: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    half: tl.constexpr = ROT_DIM // 2
    t = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    q_chunks = tl.cdiv(num_heads, BLOCK_H)
    halves = tl.arange(0, HALF_PAD)[None, :]                            # [1, HALF_PAD]
    rest = tl.arange(0, REST_PAD)[None, :]                              # [1, REST_PAD]: dims ROT_DIM + rest
    pos = tl.load(positions_ptr + t)
    cos = tl.load(cos_sin_ptr + pos * stride_cs + halves, mask=halves < half, other=0.0)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + half + halves, mask=halves < half, other=0.0)
    if chunk < q_chunks:
        head = chunk * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]         # [BLOCK_H, 1]
        ok, rest_ok = (head < num_heads) & (halves < half), (head < num_heads) & (rest < HEAD_DIM - ROT_DIM)
        o1, o2, o3 = _norm_rope(q_ptr + t * stride_qt, q_norm_ptr, cos, sin, eps, head * stride_qh, halves, ok,
                                rest, rest_ok, HEAD_DIM, ROT_DIM, HAS_NORM)
        out = q_out_ptr + t * stride_ot + head * stride_oh
        tl.store(out + halves, o1.to(q_out_ptr.dtype.element_ty), mask=ok)
        tl.store(out + halves + half, o2.to(q_out_ptr.dtype.element_ty), mask=ok)
        tl.store(out + ROT_DIM + rest, o3.to(q_out_ptr.dtype.element_ty), mask=rest_ok)
    else:
        head = (chunk - q_chunks) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
        slot = tl.load(slot_ptr + t)
        writes = (head < num_kv_heads) & (slot >= 0)
        ok, rest_ok = writes & (halves < half), writes & (rest < HEAD_DIM - ROT_DIM)
        o1, o2, o3 = _norm_rope(k_ptr + t * stride_kt, k_norm_ptr, cos, sin, eps, head * stride_kh, halves, ok,
                                rest, rest_ok, HEAD_DIM, ROT_DIM, HAS_NORM)
        # k is rounded to its own dtype first (what the torch layers hand to the cache), then the cache's
        k_dtype = k_ptr.dtype.element_ty
        cache_dtype = kv_ptr.dtype.element_ty
        dest = (kv_ptr + layer_offset + (slot // PAGE_SIZE) * stride_cblk + (slot % PAGE_SIZE) * stride_crow
                + head * stride_ch)
        tl.store(dest + halves, _to_cache(o1.to(k_dtype), kv_scale_ptr, cache_dtype, KV_SCALED, FP8_MAX), mask=ok)
        tl.store(dest + halves + half, _to_cache(o2.to(k_dtype), kv_scale_ptr, cache_dtype, KV_SCALED, FP8_MAX),
                 mask=ok)
        tl.store(dest + ROT_DIM + rest, _to_cache(o3, kv_scale_ptr, cache_dtype, KV_SCALED, FP8_MAX), mask=rest_ok)
        v_src = v_ptr + t * stride_vt + head * stride_vh
        v1, v2 = tl.load(v_src + halves, mask=ok), tl.load(v_src + halves + half, mask=ok)
        v3 = tl.load(v_src + ROT_DIM + rest, mask=rest_ok)
        v_dest = dest + stride_ckv
        tl.store(v_dest + halves, _to_cache(v1, kv_scale_ptr + 1, cache_dtype, KV_SCALED, FP8_MAX), mask=ok)
        tl.store(v_dest + halves + half, _to_cache(v2, kv_scale_ptr + 1, cache_dtype, KV_SCALED, FP8_MAX), mask=ok)
        tl.store(v_dest + ROT_DIM + rest, _to_cache(v3, kv_scale_ptr + 1, cache_dtype, KV_SCALED, FP8_MAX),
                 mask=rest_ok)


def launch_qk_norm_rope_cache_write(
    q: torch.Tensor,                # [T, H, D] (row strides free: views of the fused qkv output are fine)
    k: torch.Tensor,                # [T, Hkv, D]
    v: torch.Tensor,                # [T, Hkv, D]
    positions: torch.Tensor,        # [T] int64
    cos_sin_cache: torch.Tensor,    # [P, R] float32: cos | sin; R = D, or the rotated dims of a partial rotary
    q_norm_weight: Optional[torch.Tensor],   # [D] or None (no QK-norm)
    k_norm_weight: Optional[torch.Tensor],   # [D] or None
    eps: float,
    kv_cache: torch.Tensor,         # [L, 2, num_blocks, block_size, Hkv, D], written in place
    layer: int,
    slot_mapping: torch.Tensor,     # [T] int64, -1 = padding (not written)
    block_h: int, num_warps: int,
    kv_scale: Optional[torch.Tensor] = None,   # [2] float32 (k, v): an fp8 cache's scales
) -> torch.Tensor:
    """Returns the rotated q [T, H, D] (contiguous); writes rotated k and v into the cache. Only the first R dims
    of q and k rotate (R: the table's width), their halves paired; the rest pass through (normalized)."""
    check_kv_cache(kv_cache)
    for name, t in (("q", q), ("k", k), ("v", v), ("cos_sin_cache", cos_sin_cache)):
        check_last_dim_contiguous(name, t)
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q_norm_weight and k_norm_weight must be given together")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, page_size, rotary_dim = k.shape[1], kv_cache.shape[3], cos_sin_cache.shape[1]
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise ValueError(f"cos_sin_cache is {rotary_dim} wide: rope rotates an even number of the {head_dim} dims")
    has_norm = q_norm_weight is not None
    q_out = torch.empty((num_tokens, num_heads, head_dim), dtype=q.dtype, device=q.device)
    grid = (num_tokens, triton.cdiv(num_heads, block_h) + triton.cdiv(num_kv_heads, block_h))
    wrap_triton(qk_norm_rope_cache_write_kernel)[grid](
        q, k, v, positions, cos_sin_cache,
        q_norm_weight if has_norm else cos_sin_cache, k_norm_weight if has_norm else cos_sin_cache,
        q_out, kv_cache, slot_mapping, cos_sin_cache if kv_scale is None else kv_scale,
        eps, num_heads, num_kv_heads, layer * kv_cache.stride(0),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), cos_sin_cache.stride(0),
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), kv_cache.stride(4),
        HEAD_DIM=head_dim, ROT_DIM=rotary_dim, HALF_PAD=next_pow2(rotary_dim // 2),
        REST_PAD=next_pow2(max(head_dim - rotary_dim, 1)), PAGE_SIZE=page_size, BLOCK_H=block_h, HAS_NORM=has_norm,
        KV_SCALED=kv_scale is not None, FP8_MAX=torch.finfo(kv_cache.dtype).max,
        num_warps=num_warps,
    )
    return q_out


@triton_op("atom_triton::qk_norm_rope_cache_write", mutates_args={"kv_cache"})
def qk_norm_rope_cache_write(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
    q_norm_weight: Optional[torch.Tensor], k_norm_weight: Optional[torch.Tensor], eps: float,
    kv_cache: torch.Tensor, layer: int, slot_mapping: torch.Tensor, block_h: int, num_warps: int,
    kv_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    return launch_qk_norm_rope_cache_write(q, k, v, positions, cos_sin_cache, q_norm_weight, k_norm_weight,
                                           eps, kv_cache, layer, slot_mapping, block_h, num_warps, kv_scale)
