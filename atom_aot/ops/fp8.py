"""FP8 (e4m3) W8A8 linear layers that compute in FP8, as the custom op `atom::fp8_linear`.

Three runtime layouts, told apart by the shapes of the scales the build stored:

    per-channel weights x dynamic per-token activations   weight_scale [N],            input_scale None
    per-channel weights x static per-tensor activations   weight_scale [N],            input_scale [1]
    128x128 weight blocks x dynamic 1x128 activation groups  weight_scale [ceil(N/128), K/128], input_scale None

(a checkpoint's per-tensor weight scale is stored per channel: the same value on each row, exact.)
Every implementation quantizes the activations with `quantize_activations` below, so the CPU
reference (float32 math on the same FP8 values) checks the numerics the GPU paths compute:
`torch._scaled_mm` (cuBLASLt, row-wise scales) registered here for CUDA, and the Triton
block-scaled GEMM (atom_aot/ops/triton/fp8_gemm.py), which serves every layout.
"""
from __future__ import annotations

from typing import Optional

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max      # 448
BLOCK = 128                               # weight blocks are BLOCK x BLOCK, activation groups 1 x BLOCK
MIN_SCALE = 1e-12                         # an all-zero row or block still gets a finite scale
ONE_PROGRAM_ROW = 32768                   # widest row the one-pass quantizing kernels hold in one program

LIBRARY = torch.library.Library("atom", "FRAGMENT")
LIBRARY.define("fp8_linear(Tensor x, Tensor weight, Tensor weight_scale, Tensor? input_scale, Tensor? bias) -> Tensor")


def is_block_scaled(weight_scale: torch.Tensor) -> bool:
    return weight_scale.dim() == 2


def _to_fp8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_activations(x: torch.Tensor, input_scale: Optional[torch.Tensor],
                         block_scaled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] e4m3, scale [M, G] float32) with x ~= q * scale per group of columns.

    G is 1 (per token, or the static per-tensor scale repeated on every row) or K / 128 (block-scaled).
    """
    xf = x.float()
    if input_scale is not None:
        scale = input_scale.float().reshape(1, 1).expand(x.shape[0], 1)           # [M, 1]
        return _to_fp8(xf / scale), scale
    if block_scaled:
        groups = xf.unflatten(-1, (-1, BLOCK))                                       # [M, G, 128]
        scale = (groups.abs().amax(-1) / FP8_MAX).clamp(min=MIN_SCALE)               # [M, G]
        return _to_fp8(groups / scale[..., None]).flatten(1), scale
    scale = (xf.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)         # [M, 1]
    return _to_fp8(xf / scale), scale


def fits_one_program(width: int) -> bool:
    """Whether the one-pass quantizing kernels (ops/triton/silu_mul_quant.py, rms_norm_quant.py) hold rows of
    `width` values: their tile is the next power of two of it."""
    return 1 << max(width - 1, 0).bit_length() <= ONE_PROGRAM_ROW


def quantize_weight_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K] e4m3, scale [N] float32), one scale per output channel."""
    wf = w.float()
    scale = (wf.abs().amax(dim=1) / FP8_MAX).clamp(min=MIN_SCALE)                    # [N]
    return _to_fp8(wf / scale[:, None]), scale


def quantize_weight_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] (K a multiple of 128) -> (q [N, K] e4m3, scale [ceil(N/128), K/128] float32)."""
    n, k = w.shape
    padded = torch.zeros(-(-n // BLOCK) * BLOCK, k, dtype=torch.float32, device=w.device)
    padded[:n] = w.float()
    blocks = padded.unflatten(0, (-1, BLOCK)).unflatten(2, (-1, BLOCK))             # [N/128, 128, K/128, 128]
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=MIN_SCALE)          # [N/128, K/128]
    q = _to_fp8(blocks / scale[:, None, :, None]).flatten(2).flatten(0, 1)[:n]
    return q, scale


def quantize_expert_stack(stack: torch.Tensor, blocks: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked expert weights [E, N, K] -> (q [E, N, K] e4m3, scale [E, N], or with `blocks` each expert's
    128x128 block scales [E, ceil(N/128), K/128])."""
    if blocks:
        parts = [quantize_weight_blocks(w) for w in stack]
        return torch.stack([q for q, _ in parts]), torch.stack([s for _, s in parts])
    q, scale = quantize_weight_per_channel(stack.flatten(0, 1))          # every expert's rows at once
    return q.view(stack.shape), scale.view(stack.shape[:2])


def dequantize_weight(weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight [N, K] a quantized one stands for."""
    w = weight.float()
    if not is_block_scaled(weight_scale):
        return w * weight_scale[:, None]
    n, k = w.shape
    per_element = weight_scale.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return w * per_element


def check_block_shapes(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> None:
    k = weight.shape[1]
    expected = (-(-weight.shape[0] // BLOCK), k // BLOCK)
    if k % BLOCK or tuple(weight_scale.shape) != expected or x.shape[-1] != k:
        raise ValueError(f"block-scaled fp8: K ({k}) must be a multiple of {BLOCK}, weight_scale must be "
                         f"{list(expected)} (got {list(weight_scale.shape)}), x must end in K (got {list(x.shape)})")


def fp8_linear_reference(
    x: torch.Tensor,                          # [M, K] activations (bf16/fp16/fp32)
    weight: torch.Tensor,                     # [N, K] e4m3
    weight_scale: torch.Tensor,               # [N] or [ceil(N/128), K/128] float32
    input_scale: Optional[torch.Tensor],      # [1] float32 (static) or None (dynamic)
    bias: Optional[torch.Tensor],             # [N] or None
) -> torch.Tensor:
    """The GPU paths' numerics on the CPU: the same FP8 activations, products summed in float32."""
    block_scaled = is_block_scaled(weight_scale)
    if block_scaled:
        check_block_shapes(x, weight, weight_scale)
    xq, x_scale = quantize_activations(x, input_scale, block_scaled)
    if not block_scaled:
        return scaled_matmul_reference(xq, x_scale, weight, weight_scale, bias, x.dtype)
    xf = (xq.float().unflatten(1, (-1, BLOCK)) * x_scale[..., None]).flatten(1)      # [M, K]
    y = xf @ dequantize_weight(weight, weight_scale).T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def scaled_matmul_reference(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                            weight_scale: torch.Tensor, bias: Optional[torch.Tensor],
                            out_dtype: torch.dtype) -> torch.Tensor:
    """Per-channel weights on activations already quantized (xq [M, K] e4m3, x_scale [M, 1]), float32 sums."""
    y = (xq.float() @ weight.float().T) * x_scale * weight_scale                     # [M, N]
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def fp8_linear_cublas(x, weight, weight_scale, input_scale, bias) -> torch.Tensor:
    """cuBLASLt through `torch._scaled_mm` with row-wise scales (a [M, 1] x b [1, N]); sm89+ only."""
    if is_block_scaled(weight_scale):
        raise ValueError("block-scaled fp8 linears run on the triton fp8_linear backend, not cuBLAS; "
                         "rebuild the artifact with this atom-aot's atom-build")
    xq, x_scale = quantize_activations(x, input_scale, block_scaled=False)
    return scaled_mm_rowwise(xq, x_scale, weight, weight_scale, bias, x.dtype)


def scaled_mm_rowwise(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                      bias: Optional[torch.Tensor], out_dtype: torch.dtype) -> torch.Tensor:
    """`torch._scaled_mm` on quantized activations: xq [M, K] e4m3 x scale [M, 1], weight [N, K] x scale [N]."""
    y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale.contiguous(), scale_b=weight_scale[None, :],
                         out_dtype=out_dtype)                                         # [M, N]
    return y if bias is None else y + bias


LIBRARY.impl("fp8_linear", fp8_linear_reference, "CPU")
LIBRARY.impl("fp8_linear", fp8_linear_cublas, "CUDA")


@torch.library.register_fake("atom::fp8_linear", lib=LIBRARY)
def _(x, weight, weight_scale, input_scale, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


fp8_linear = torch.ops.atom.fp8_linear
