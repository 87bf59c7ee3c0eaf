"""`atom_triton::rms_norm` and `atom_triton::fused_add_rms_norm`: one program per token row.

The fused form adds the residual and normalizes in one read of each input (the torch layer reads
x and residual, writes the sum, reads it back). Rounding follows atom_aot/models/layers.py:
the sum is rounded to the dtype (it is the new residual), the norm is computed in float32 and
rounded to the dtype before the weight multiplies it.
"""
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton._common import check_last_dim_contiguous, next_pow2


@dataclass(frozen=True)
class RMSNormConfig:
    num_warps: int = 4      # the block is the whole (padded) row; only the warps are tunable

    def as_args(self) -> tuple[int]:
        return (self.num_warps,)

    def as_dict(self) -> dict:
        return asdict(self)


CANDIDATE_CONFIGS = (RMSNormConfig(1), RMSNormConfig(2), RMSNormConfig(4), RMSNormConfig(8), RMSNormConfig(16))
DEFAULT_CONFIG = RMSNormConfig(4)


@triton.jit
def rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr,
    eps, hidden,
    stride_x, stride_r, stride_o, stride_nr,
    BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)     # the new residual, rounded like torch's add
        tl.store(new_residual_ptr + row * stride_nr + cols, x, mask=ok)
    h = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(h * h, 0) / hidden + tl.cast(eps, tl.float32))   # Inductor passes floats as fp64
    w = tl.load(weight_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    out = w * (h * inv).to(x.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


def launch_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                    num_warps: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x, residual: [T, N]; weight: [N]. Returns (out [T, N], new residual [T, N] or None)."""
    check_last_dim_contiguous("x", x)
    num_tokens, hidden = x.shape
    out = torch.empty((num_tokens, hidden), dtype=x.dtype, device=x.device)
    new_residual = None if residual is None else torch.empty_like(out)
    has_residual = residual is not None
    if has_residual:
        check_last_dim_contiguous("residual", residual)
    r, nr = (residual, new_residual) if has_residual else (x, out)   # placeholders never touched
    wrap_triton(rms_norm_kernel)[(num_tokens,)](
        x, r, weight, out, nr, eps, hidden,
        x.stride(0), r.stride(0), out.stride(0), nr.stride(0),
        BLOCK=next_pow2(hidden), HAS_RESIDUAL=has_residual, num_warps=num_warps,
    )
    return out, new_residual


@triton_op("atom_triton::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, num_warps: int) -> torch.Tensor:
    return launch_rms_norm(x, None, weight, eps, num_warps)[0]


@triton_op("atom_triton::fused_add_rms_norm", mutates_args=())
def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                       num_warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * norm(x + residual), x + residual)."""
    return launch_rms_norm(x, residual, weight, eps, num_warps)
