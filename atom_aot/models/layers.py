"""Building blocks shared by the model families: norms, rotary embedding, linear layers (quantized
ones: quant_layers.py).

Each block computes exactly what Hugging Face's reference does, in the same order, so greedy
decoding matches token for token in float32. The math they share with the attention backends
(RMS norm, rope) lives in atom_aot/ops.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from atom_aot.artifact.manifest import linear_scheme
from atom_aot.distributed.collectives import all_reduce, all_reduce_add_rms_norm
from atom_aot.models.quant_layers import QuantizedInput, make_quantized_linear
from atom_aot.ops.norm import rms_norm


class RMSNorm(nn.Module):
    """RMSNorm with an optional residual add folded in (returns the new residual too)."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype))
        # where this norm feeds an fp8 linear alone, the phase row's rms_norm_quant backend (use_linear_kernels):
        # the residual path then returns that linear's input quantized (a QuantizedInput)
        self.quantizer = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, partial=None):
        """`partial` (models/parallel.py PartialSums): x holds this rank's partial sums, all-reduced here (on GPUs
        in the kernel that adds and normalizes; on the CPU first, then the add and norm below)."""
        if self.quantizer is not None and residual is not None and partial is None:
            q, scale, residual = self.quantizer(x, residual, self.weight, self.eps)
            return QuantizedInput(q, scale, x.dtype), residual
        if partial is not None and x.is_cuda:
            return all_reduce_add_rms_norm(x, residual, self.weight, self.eps, partial.peers, partial.world_size)
        if partial is not None:
            x = all_reduce(x)
        if residual is not None:
            x = x + residual
            residual = x
        out = rms_norm(x, self.weight, self.eps)
        return out if residual is None else (out, residual)


class RotaryEmbedding(nn.Module):
    """Holds the precomputed cos/sin table (a weight of the artifact) that rotary embedding reads."""

    def __init__(self, head_dim: int, max_positions: int):
        super().__init__()
        self.register_buffer("cos_sin_cache", torch.empty(max_positions, head_dim, dtype=torch.float32))


class Linear(nn.Module):
    """y = x W^T (+ b). W is stored [out, in] like nn.Linear, possibly fused from several checkpoint tensors."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def make_linear(in_features: int, out_features: int, bias: bool, dtype: torch.dtype, quant: str) -> nn.Module:
    """A linear of the weights scheme `quant`: "none", one of quant_layers.FP8_SCHEMES / INT8_SCHEMES / INT4_SCHEMES,
    or a scheme of the experts alone (mxfp4: the linears stay in the model dtype)."""
    quant = linear_scheme(quant)
    if quant == "none":
        return Linear(in_features, out_features, bias, dtype)
    return make_quantized_linear(in_features, out_features, bias, dtype, quant)
