"""MXFP4 weight tiles widened in registers, by bit patterns (ops/mxfp4.py has the layout and the values).

No int -> float conversion instruction (the int4 GEMM's first form spent its time in them: ops/triton/int4_gemm.py),
no per-code branches and no bf16 arithmetic (Triton's interpreter has none: it would multiply the bf16 bit patterns
as integers). Each nibble's three magnitude bits (exponent e1 e0, mantissa m) are placed in float32's two lowest
exponent bits and its top mantissa bit, its sign in bit 31: read as float32 that is exactly the e2m1 value times
2^-126 for every code (code 1, 0.5, lands on the subnormal 2^-127; 0 on 0), two shifts and two masks per value.
Two float32 multiplies then give the weight exactly: by 2^126, and by the e8m0 scale 2^(e - 127), the float32 whose
exponent field is e (e = 0: the subnormal 0x00400000; e = 255: NaN). Float32 subnormals are kept: the sm90 PTX is
mul.f32 without .ftz, and AMD's kernels run in IEEE denormal mode. The bf16 conversion of the exact weight is exact.
"""
import triton
import triton.language as tl

MXFP4_BLOCK: tl.constexpr = tl.constexpr(32)    # values per scale, along K
TWO_POW_126: tl.constexpr = tl.constexpr(2.0 ** 126)


@triton.jit
def e2m1_tiny(packed, HIGH: tl.constexpr):
    """The e2m1 value of each byte's low nibble (HIGH: its high one) times 2^-126, as float32 by its bits."""
    b = packed.to(tl.int32)
    if HIGH:
        bits = ((b & 0x70) << 18) | ((b & 0x80) << 24)
    else:
        bits = ((b & 0x07) << 22) | ((b & 0x08) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def e8m0_float32(exponent):
    """e8m0 exponents (uint8) -> 2^(e - 127) as float32 (e = 0: the subnormal 0x00400000; e = 255: NaN)."""
    e = exponent.to(tl.int32)
    bits = tl.where(e == 0, 0x00400000, tl.where(e == 255, 0x7FC00000, e << 23))
    return bits.to(tl.float32, bitcast=True)


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
    tiny = tl.join(e2m1_tiny(packed, False), e2m1_tiny(packed, True))                    # [BLOCK_N, HALF, 2]: k order
    w = (tiny.reshape(BLOCK_N, GROUPS, MXFP4_BLOCK) * TWO_POW_126) * e8m0_float32(e)[:, :, None]
    w = tl.trans(w.reshape(BLOCK_N, BLOCK_K))
    # one return: Triton generates the statements after a constexpr branch's return too, and two returns of
    # different dtypes do not compile
    if not FLOAT32:
        w = w.to(tl.bfloat16)
    return w
