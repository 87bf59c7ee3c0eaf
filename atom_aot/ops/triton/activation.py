"""`atom_triton::silu_and_mul`: out = silu(gate) * up over the fused gate_up projection [T, 2I].

Rounding follows the torch MLP (`F.silu(gate) * up` in the model dtype): silu in float32,
rounded to the dtype, then the product rounded again.
"""
from dataclasses import asdict, dataclass

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from atom_aot.ops.triton._common import check_last_dim_contiguous


@dataclass(frozen=True)
class SiluMulConfig:
    block: int = 1024       # columns of the output per program
    num_warps: int = 4

    def as_args(self) -> tuple[int, int]:
        return (self.block, self.num_warps)

    def as_dict(self) -> dict:
        return asdict(self)


CANDIDATE_CONFIGS = (SiluMulConfig(512, 2), SiluMulConfig(1024, 4), SiluMulConfig(2048, 4),
                     SiluMulConfig(2048, 8), SiluMulConfig(4096, 8))
DEFAULT_CONFIG = SiluMulConfig(1024, 4)


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, inter, stride_x, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=ok, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    out = act.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=ok)


def launch_silu_and_mul(gate_up: torch.Tensor, block: int, num_warps: int) -> torch.Tensor:
    """gate_up: [T, 2I] (gate first) -> [T, I]."""
    check_last_dim_contiguous("gate_up", gate_up)
    num_tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((num_tokens, inter), dtype=gate_up.dtype, device=gate_up.device)
    wrap_triton(silu_and_mul_kernel)[(num_tokens, triton.cdiv(inter, block))](
        gate_up, out, inter, gate_up.stride(0), out.stride(0), BLOCK=block, num_warps=num_warps,
    )
    return out


@triton_op("atom_triton::silu_and_mul", mutates_args=())
def silu_and_mul(gate_up: torch.Tensor, block: int, num_warps: int) -> torch.Tensor:
    return launch_silu_and_mul(gate_up, block, num_warps)
