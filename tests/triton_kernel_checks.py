"""What the kernel tests and scripts/bench_kernels.py check the atom_triton ops with: an error
metric, the torch references of the fused rope/cache op and the fused all-reduce + norm, and the patch that makes Triton's CPU
interpreter compute what compiled kernels compute. Plain Python (no pytest), so the benchmark
script imports it too."""
from __future__ import annotations

import torch

from atom_aot.ops.attention import write_kv_cache
from atom_aot.ops.norm import rms_norm
from atom_aot.ops.rope import apply_rope


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere makes it NaN (and so fails `<`)."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


@torch.no_grad()
def rope_cache_reference(q, k, v, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, kv_cache, layer,
                         slot_mapping) -> torch.Tensor:
    """What the reference attention backend does before attention: optional QK-norm, rope, the cache write."""
    if q_norm_weight is not None:
        q, k = rms_norm(q, q_norm_weight, eps), rms_norm(k, k_norm_weight, eps)
    q, k = apply_rope(positions, q, k, cos_sin_cache)
    write_kv_cache(kv_cache[layer], k, v, slot_mapping)
    return q


def all_reduce_norm_reference(partials: list[torch.Tensor], residual: torch.Tensor, weight: torch.Tensor,
                              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, residual_out) of the fused all-reduce + add + RMSNorm: the ranks' partial sums summed in float32 in
    rank order and cast back (the all-reduce), then RMSNorm's add and norm."""
    summed = torch.stack([p.float() for p in partials]).sum(0).to(residual.dtype) + residual
    return rms_norm(summed, weight, eps), summed


def patch_triton_interpreter() -> None:
    """Make TRITON_INTERPRET=1 compute what the compiled kernels compute (Triton 3.6, numpy >= 2.4).

    Four gaps of the interpreter, none of which touches compiled kernels:
    - scalars are 1-element arrays converted with `int(array)`, which numpy 2.4 refuses, so a
      `range(lo, hi)` over values loaded in the kernel fails;
    - bfloat16 is held as raw uint16 bits and `tl.dot` multiplies those bits as integers;
    - narrowing float casts (to bf16, to fp8) truncate instead of rounding to nearest even, and
      casts from fp8 to fp16 convert the raw bits as integers;
    - libdevice's functions (extern calls) return nothing.
    The casts and the bf16 dot are redone through torch, whose CPU conversions round like the GPU;
    libdevice's exp and log become torch's on the CPU, standing in for the GPU, where torch's CUDA exp
    and log are the same CUDA math functions (numpy's float32 exp differs from torch's CPU exp in the
    last bit of ~40% of values; the sampler's threshold kernel must match torch's bit for bit).
    """
    import numpy as np
    import triton.language as tl
    from triton.language.extra import libdevice
    from triton.runtime import interpreter

    if getattr(interpreter, "_atom_patched", False):
        return
    interpreter._atom_patched = True
    torch_dtypes = {tl.float32: torch.float32, tl.float16: torch.float16, tl.bfloat16: torch.bfloat16,
                    tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}
    raw = {1: (torch.uint8, np.uint8), 2: (torch.int16, np.uint16), 4: (torch.float32, np.float32)}

    def to_torch(data, dtype):
        if dtype == tl.float16:   # the one 16-bit float numpy holds as itself
            return torch.from_numpy(np.ascontiguousarray(data, dtype=np.float16))
        bits, _ = raw[dtype.primitive_bitwidth // 8]
        return torch.from_numpy(np.ascontiguousarray(data)).view(bits).view(torch_dtypes[dtype])

    def to_numpy(t, dtype):
        if dtype == tl.float16:
            return t.numpy()
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
        raw_bits = (tl.bfloat16, tl.float8e4nv, tl.float8e5)   # held as integer bits by the interpreter
        if (dst_t in raw_bits or src_t in raw_bits) and src_t in torch_dtypes and dst_t in torch_dtypes and src_t != dst_t:
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

    def by_torch(op):
        def call(x):
            out = op(torch.from_numpy(np.ascontiguousarray(x.handle.data))).numpy()
            return tl.core.tensor(interpreter.TensorHandle(out, x.handle.dtype), x.type)
        return call
    libdevice.exp, libdevice.log = by_torch(torch.exp), by_torch(torch.log)
