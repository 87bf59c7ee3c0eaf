"""MXFP4 weight tiles widened in registers, by bit patterns (ops/mxfp4.py has the layout and the values).

No int -> float conversion instruction (the int4 GEMM's first form spent its time in them: ops/triton/int4_gemm.py)
and no bf16 arithmetic (Triton's interpreter has none: it would multiply the bf16 bit patterns as integers):
- an e2m1 code is its float32 value by bits: the three magnitude bits (exponent e1 e0, mantissa m) go to float32's
  two lowest exponent bits and its top mantissa bit, the exponent rebased by adding 126 (e2m1's bias is 1); code 1
  (0.5, e2m1's one subnormal) and 0 are their own patterns; the sign moves to bit 31;
- the e8m0 scale 2^(e - 127) is the float32 whose exponent field is e (e = 0: the subnormal 0x00400000, e = 255 NaN);
- one float32 multiply gives the weight exactly (ops/mxfp4.py); its bf16 is its top 16 bits, exactly (the low 16
  are zero), a shift rather than a rounding conversion.
At e = 0 or 1 the scale or the product is a float32 subnormal, which the multiply keeps (the sm90 PTX is mul.f32,
no .ftz; AMD's kernels run in IEEE denormal mode).
"""
import triton
import triton.language as tl

MXFP4_BLOCK: tl.constexpr = tl.constexpr(32)    # values per scale, along K


@triton.jit
def e2m1_float32(code):
    """e2m1 codes (0..15, any int type) -> their values as float32."""
    c = code.to(tl.int32)
    magnitude = c & 7
    bits = tl.where(magnitude >= 2, (magnitude << 22) + (126 << 23), tl.where(magnitude == 1, 0x3F000000, 0))
    return (bits | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def e8m0_float32(exponent):
    """e8m0 exponents (uint8) -> 2^(e - 127) as float32 (e = 0: the subnormal 0x00400000; e = 255: NaN)."""
    e = exponent.to(tl.int32)
    bits = tl.where(e == 0, 0x00400000, tl.where(e == 255, 0x7FC00000, e << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def exact_bf16(x):
    """float32 values with at most 8 significant bits (and inf, NaN) -> bf16, exactly: their top 16 bits."""
    return (x.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def mxfp4_tile(w_ptr, s_ptr, rows, row_ok, k0, K, stride_wn, stride_sn, FLOAT32: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Weight tile [BLOCK_K, BLOCK_N] in bf16 (float32 if FLOAT32: float32 activations): w[k0 + i, rows[n]] of one
    expert's stack, w_ptr at its packed bytes [N, K/2], s_ptr at its scales [N, K/32] (K and BLOCK_K multiples
    of 32)."""
    HALF: tl.constexpr = BLOCK_K // 2
    GROUPS: tl.constexpr = BLOCK_K // MXFP4_BLOCK
    j = k0 // 2 + tl.arange(0, HALF)
    packed = tl.load(w_ptr + rows.to(tl.int64)[:, None] * stride_wn + j[None, :],
                     mask=row_ok[:, None] & (j < K // 2)[None, :], other=0)                # [BLOCK_N, HALF] uint8
    g = k0 // MXFP4_BLOCK + tl.arange(0, GROUPS)
    e = tl.load(s_ptr + rows.to(tl.int64)[:, None] * stride_sn + g[None, :],
                mask=row_ok[:, None] & (g < K // MXFP4_BLOCK)[None, :], other=127)        # [BLOCK_N, GROUPS] uint8
    values = tl.join(e2m1_float32(packed & 0xF), e2m1_float32(packed >> 4))              # [BLOCK_N, HALF, 2]: k order
    w = (values.reshape(BLOCK_N, GROUPS, MXFP4_BLOCK) * e8m0_float32(e)[:, :, None]).reshape(BLOCK_N, BLOCK_K)
    if FLOAT32:
        return tl.trans(w)
    return tl.trans(exact_bf16(w))
