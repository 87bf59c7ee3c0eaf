"""The `silu_mul_quant` backends: what makes the e4m3 input of an FP8 MLP's down projection (per-token
dynamic scales, `fp8` scheme) from its gate_up output, chosen per phase from tuning.json.

`inductor`: the torch code (F.silu(gate) * up, then ops/fp8.quantize_activations) left in the graph for
Inductor to fuse: a looped amax reduction and a quantizing kernel, each reading gate and up.
`triton`: `atom_triton::silu_mul_quant`, one pass with the row in registers (ops/triton/silu_mul_quant.py).
An artifact whose tuning.json has no such row (built before it existed, or for the CPU) runs the down
projection on F.silu(gate) * up as it always did (models/decoder.py GatedMLP; models/quant_layers.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import launch_configs


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [M, 2N], gate first (GatedMLP's packing)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class InductorSiluMulQuant:
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune

    def __call__(self, gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from atom_aot.ops.fp8 import quantize_activations
        return quantize_activations(silu_mul(gate_up), None, block_scaled=False)


class TritonSiluMulQuant:
    def __init__(self, choice: BackendChoice):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton._common import RowConfig
        self.args = launch_configs(choice, {"silu_mul_quant": RowConfig})["silu_mul_quant"].as_args()

    def __call__(self, gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.atom_triton.silu_mul_quant(gate_up, *self.args)
