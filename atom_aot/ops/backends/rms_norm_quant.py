"""The `rms_norm_quant` backends: what makes the e4m3 input of an FP8 qkv or gate_up projection (per-token dynamic
scales, `fp8` scheme) from the residual stream, with the residual add and the RMSNorm before it, chosen per phase
from tuning.json.

`inductor`: the torch code (x + residual, ops/norm.rms_norm, then ops/fp8.quantize_activations) left in the graph
for Inductor to fuse: one looped reduction kernel that walks the row three times.
`triton`: `atom_triton::add_rms_norm_quant`, one pass with the row in registers (ops/triton/rms_norm_quant.py).
A norm whose phase row has no such choice (artifacts built before it, the CPU's, a layer whose consumer is not a
per-token fp8 linear) runs as it always did: models/layers.RMSNorm, then the linear quantizes its input.
"""
from __future__ import annotations

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import launch_configs


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): models/layers.RMSNorm's residual path."""
    from atom_aot.ops.norm import rms_norm
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


class InductorRmsNormQuant:
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from atom_aot.ops.fp8 import quantize_activations
        normed, summed = add_rms_norm(x, residual, weight, eps)
        return (*quantize_activations(normed, None, block_scaled=False), summed)


class TritonRmsNormQuant:
    def __init__(self, choice: BackendChoice):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton._common import RowConfig
        self.args = launch_configs(choice, {"rms_norm_quant": RowConfig})["rms_norm_quant"].as_args()

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.ops.atom_triton.add_rms_norm_quant(x, residual, weight, eps, *self.args)
