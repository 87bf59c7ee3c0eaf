"""Random paged batches and error metrics, shared by the kernel tests and scripts/bench_kernels.py.

Everything is drawn fresh from a generator (never zeros) so that a kernel that skips a row or
reads the wrong slot cannot pass by accident.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    """One step's attention inputs over a random paged cache (see atom_aot/ops/attention.py)."""
    kv_cache: torch.Tensor         # [L, 2, num_blocks, block_size, Hkv, D]
    block_tables: torch.Tensor     # [B, max_blocks] int32 (unused entries point at random blocks)
    seq_lens: torch.Tensor         # [B] int32: context + new tokens
    query_start_loc: torch.Tensor  # [B + 1] int32
    slot_mapping: torch.Tensor     # [T] int64: slots of the new tokens, -1 for padding rows
    positions: torch.Tensor        # [T] int64: position of each new token (0 for padding rows)
    num_real_tokens: int           # rows of q that belong to a sequence; the rest is padding


def make_paged_batch(context_lens: list[int], query_lens: list[int], num_kv_heads: int, head_dim: int,
                     block_size: int = 16, num_layers: int = 2, pad_tokens: int = 0,
                     dtype: torch.dtype = torch.float32, device: str = "cpu",
                     generator: torch.Generator | None = None) -> PagedBatch:
    """Sequence b has context_lens[b] cached tokens and query_lens[b] new ones (seq_len = sum).

    Blocks are handed out in a random order so that logical and physical block order differ; the
    cache is filled with random values everywhere, new tokens' slots included.
    """
    g = generator or torch.Generator().manual_seed(0)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    max_blocks = max(blocks_per_seq) + 1
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=g)
    block_tables = torch.randint(0, num_blocks, (len(seq_lens), max_blocks), generator=g)
    slots, positions, taken = [], [], 0
    for b, (ctx, n) in enumerate(zip(context_lens, query_lens)):
        block_tables[b, :blocks_per_seq[b]] = perm[taken:taken + blocks_per_seq[b]]
        taken += blocks_per_seq[b]
        for pos in range(ctx, ctx + n):
            slots.append(int(block_tables[b, pos // block_size]) * block_size + pos % block_size)
            positions.append(pos)
    slots += [-1] * pad_tokens
    positions += [0] * pad_tokens
    shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
    if device == "cpu":
        kv_cache = torch.randn(shape, generator=g).to(dtype)
    else:   # big caches: draw on the device (seeded from g, still never zeros)
        dev_g = torch.Generator(device=device).manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
        kv_cache = torch.randn(shape, generator=dev_g, device=device,
                               dtype=torch.float32 if dtype.itemsize == 1 else dtype).to(dtype)
    starts = torch.tensor([0] + query_lens).cumsum(0)
    return PagedBatch(
        kv_cache=kv_cache.to(device),
        block_tables=block_tables.to(torch.int32).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=starts.to(torch.int32).to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        num_real_tokens=sum(query_lens),
    )


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere makes it NaN (and so fails `<`)."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def randn(*shape, dtype: torch.dtype = torch.float32, device: str = "cpu",
          generator: torch.Generator | None = None, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=generator) * scale).to(dtype).to(device)


# ---- references: the torch layers the models run (atom_aot/models/layers.py), step by step ----

@torch.no_grad()
def rope_cache_reference(q, k, v, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, kv_cache, layer,
                         slot_mapping) -> torch.Tensor:
    """What DecoderAttention does before attention: optional QK-norm, rope, then the cache write."""
    from atom_aot.models.layers import apply_rope
    from atom_aot.ops.attention import write_kv_cache
    if q_norm_weight is not None:
        q, k = (rms_norm_reference(t, None, w, eps) for t, w in ((q, q_norm_weight), (k, k_norm_weight)))
    q, k = apply_rope(positions, q, k, cos_sin_cache)
    write_kv_cache(kv_cache[layer], k, v, slot_mapping)
    return q


@torch.no_grad()
def rms_norm_reference(x, residual, weight, eps):
    """RMSNorm of the models (HF semantics); returns (out, new residual) when residual is given."""
    from atom_aot.models.layers import RMSNorm
    norm = RMSNorm(x.shape[-1], eps, x.dtype).to(x.device)
    norm.weight.copy_(weight)
    return norm(x) if residual is None else norm(x, residual)


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def patch_triton_interpreter() -> None:
    """Make TRITON_INTERPRET=1 compute what the compiled kernels compute (Triton 3.6, numpy >= 2.4).

    Three gaps of the interpreter, none of which touches compiled kernels:
    - scalars are 1-element arrays converted with `int(array)`, which numpy 2.4 refuses, so a
      `range(lo, hi)` over values loaded in the kernel fails;
    - bfloat16 is held as raw uint16 bits and `tl.dot` multiplies those bits as integers;
    - narrowing float casts (to bf16, to fp8) truncate instead of rounding to nearest even.
    The casts and the bf16 dot are redone through torch, whose CPU conversions round like the GPU.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter, "_atom_patched", False):
        return
    interpreter._atom_patched = True
    torch_dtypes = {tl.float32: torch.float32, tl.float16: torch.float16, tl.bfloat16: torch.bfloat16,
                    tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}
    raw = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.uint16), 4: (torch.float32, np.float32)}

    def to_torch(data, dtype):
        bits, _ = raw[dtype.primitive_bitwidth // 8]
        return torch.from_numpy(np.ascontiguousarray(data)).view(bits).view(torch_dtypes[dtype])

    def to_numpy(t, dtype):
        bits, np_bits = raw[dtype.primitive_bitwidth // 8]
        return t.view(bits).numpy().view(np_bits)

    original_patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_tensor
    builder = interpreter.InterpreterBuilder
    original_cast, original_dot = builder.cast_impl, builder.create_dot

    def torch_cast(src, dst_t):
        out = to_torch(src.data, src.dtype.scalar).to(torch_dtypes[dst_t])
        return interpreter.TensorHandle(to_numpy(out, dst_t).reshape(src.data.shape), dst_t)

    def cast_impl(self, src, dst_type):
        src_t, dst_t = src.dtype.scalar, dst_type.scalar
        narrowing = dst_t in (tl.bfloat16, tl.float8e4nv, tl.float8e5) or src_t == tl.bfloat16
        if narrowing and src_t in torch_dtypes and dst_t in torch_dtypes and src_t != dst_t:
            return torch_cast(src, dst_t)
        return original_cast(self, src, dst_type)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if tl.bfloat16 in (a.dtype.scalar, b.dtype.scalar):
            a = interpreter.TensorHandle(to_torch(a.data, a.dtype.scalar).float().numpy(), tl.float32)
            b = interpreter.TensorHandle(to_torch(b.data, b.dtype.scalar).float().numpy(), tl.float32)
        return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    original_fp_to_fp = builder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        known = src.dtype.scalar in torch_dtypes and dst_type.scalar in torch_dtypes
        if known and rounding_mode in (None, interpreter._ir.ROUNDING_MODE.RTNE):
            return torch_cast(src, dst_type.scalar)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    builder.cast_impl, builder.create_dot, builder.create_fp_to_fp = cast_impl, create_dot, create_fp_to_fp
    for name in ("create_si_to_fp", "create_ui_to_fp", "create_fp_to_si", "create_fp_to_ui",
                 "create_fp_ext", "create_fp_trunc"):
        if getattr(builder, name, None) is not None:
            setattr(builder, name, lambda self, src, dst_type: self.cast_impl(src, dst_type))


class PoisonedEmpty:
    """Context in which torch.empty returns NaN-filled float tensors (deterministic mode's fill).

    The ops allocate their own outputs and workspaces; with this on, any element a kernel forgets
    to write stays NaN, and `rel_error` turns NaN.
    """

    def __enter__(self):
        self.prev = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
        torch.use_deterministic_algorithms(True, warn_only=True)
        return self

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.prev[0], warn_only=self.prev[1])


def require_interpreted_kernels() -> None:
    """Skips the calling test module if triton or the kernels were imported before TRITON_INTERPRET=1
    was set (earlier in this process): compiled kernels cannot run on CPU tensors, and an interpreted
    kernel cannot call a compiled `tl.*` library function."""
    import pytest
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    from atom_aot.ops.triton.attention_kernels import paged_attention_kernel
    if not (isinstance(paged_attention_kernel, InterpretedFunction) and isinstance(tl.sum, InterpretedFunction)):
        pytest.skip("atom_aot.ops.triton was imported before TRITON_INTERPRET=1 was set: run these tests "
                    "in their own process", allow_module_level=True)
