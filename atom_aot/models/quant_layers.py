"""Quantized linear layers: FP8 W8A8 that computes in FP8 (atom_aot/ops/fp8.py).

A layer's scheme (artifact/manifest.py LINEAR_SCHEMES) fixes its parameters, so the runtime
builds the module on meta and assigns the artifact's tensors as they are:

    fp8         weight [N, K] e4m3, weight_scale [N]                        activations: dynamic per token
    fp8-static  weight [N, K] e4m3, weight_scale [N], input_scale [1]       activations: the checkpoint's scale
    fp8-block   weight [N, K] e4m3, weight_scale [ceil(N/128), ceil(K/128)]  activations: dynamic 1x128 groups
    fp8-ub      weight [N, K] e4m3, weight_scale [N], activation_scale_ub [1]
                                                    activations: dynamic per token, scale <= ub / 448 (fbgemm_fp8)

fp8-ub clamps the activations to [-ub, ub] before the per-token quantization: the token's scale is then
min(amax, ub) / 448 and the values beyond ub saturate at +-448, exactly fbgemm's bounded scale, with
no change to the GEMM's kernels.

The GEMM runs through the `fp8_linear` backend the phase's tuning row names (aten or triton).
"""
from __future__ import annotations

import torch
from torch import nn

from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
from atom_aot.ops.backends import make_backend
from atom_aot.ops.fp8 import BLOCK, FP8_DTYPE

FP8_SCHEMES = ("fp8", "fp8-static", "fp8-block", "fp8-ub")


def _frozen(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Fp8Linear(nn.Module):
    """y = x W^T (+ b) with W and x in e4m3 and float32 accumulation (layouts: module docstring)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, scheme: str = "fp8"):
        super().__init__()
        if scheme not in FP8_SCHEMES:
            raise ValueError(f"unknown fp8 scheme {scheme!r}; known: {', '.join(FP8_SCHEMES)}")
        self.scheme = scheme
        self.weight = _frozen(out_features, in_features, dtype=FP8_DTYPE)
        scale_shape = ((-(-out_features // BLOCK), -(-in_features // BLOCK)) if scheme == "fp8-block"
                       else (out_features,))
        self.weight_scale = _frozen(*scale_shape, dtype=torch.float32)
        self.input_scale = _frozen(1, dtype=torch.float32) if scheme == "fp8-static" else None
        self.activation_scale_ub = _frozen(1, dtype=torch.float32) if scheme == "fp8-ub" else None
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        # the aten op (reference on the CPU) until use_linear_kernels sets the phase's choice
        self.gemm = make_backend("fp8_linear", BackendChoice("aten"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, K] -> [T, N]
        if self.activation_scale_ub is not None:
            bound = self.activation_scale_ub.to(x.dtype)                 # [1]
            x = torch.clamp(x, min=-bound, max=bound)
        return self.gemm(x, self.weight, self.weight_scale, self.input_scale, self.bias)


def use_linear_kernels(model: nn.Module, row: PhaseTuning) -> None:
    """Point every quantized linear of `model` at the `fp8_linear` backend `row` names (a model with
    none asks the row nothing)."""
    layers = [m for m in model.modules() if isinstance(m, Fp8Linear)]
    if layers:
        gemm = make_backend("fp8_linear", row.op("fp8_linear"))
        for layer in layers:
            layer.gemm = gemm
