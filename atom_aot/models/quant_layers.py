"""Quantized linear layers: FP8 W8A8 that computes in FP8 (atom_aot/ops/fp8.py), INT8 W8A8 that
computes in int8 (atom_aot/ops/int8.py) and INT4 weight-only W4A16 (atom_aot/ops/int4.py).

A layer's scheme (artifact/manifest.py LINEAR_SCHEMES) fixes its parameters, so the runtime
builds the module on meta and assigns the artifact's tensors as they are:

    fp8         weight [N, K] e4m3, weight_scale [N]                        activations: dynamic per token
    fp8-static  weight [N, K] e4m3, weight_scale [N], input_scale [1]       activations: the checkpoint's scale
    fp8-block   weight [N, K] e4m3, weight_scale [ceil(N/128), ceil(K/128)]  activations: dynamic 1x128 groups
    fp8-ub      weight [N, K] e4m3, weight_scale [N], activation_scale_ub [1]
                                                    activations: dynamic per token, scale <= ub / 448 (fbgemm_fp8)
    int8        weight [N, K] int8, weight_scale [N]                        activations: dynamic per token (int8)
    int8-static weight [N, K] int8, weight_scale [N], input_scale [1]       activations: the checkpoint's scale
    int4-w4a16  weight [N, K/2] uint8 (two nibbles), weight_scale [N, K/128] float32, weight_zero [N, K/128] uint8
                                                    activations: as they are (bf16/fp16), groups of 128 inputs
    int4-w4a16-channel  the same with one group per output channel: weight_scale, weight_zero [N, 1]

fp8-ub clamps the activations to [-ub, ub] before the per-token quantization: the token's scale is then
min(amax, ub) / 448 and the values beyond ub saturate at +-448, exactly fbgemm's bounded scale, with
no change to the GEMM's kernels.

The GEMM runs through the backend the phase's tuning row names for `fp8_linear` (aten or triton),
`int8_linear` (aten) or `int4_linear` (aten or triton). An `fp8` layer may take its input already quantized:
a down projection fed by a SiLU-mul (GatedMLP) from the row's `silu_mul_quant` backend (`forward_silu_mul`), a
qkv or gate_up projection fed by an RMSNorm with a residual from the row's `rms_norm_quant` backend (the norm
returns a `QuantizedInput`); each Inductor's kernels or one Triton pass. A row without them keeps the plain path.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
from atom_aot.ops.backends import make_backend
from atom_aot.ops.fp8 import BLOCK, FP8_DTYPE, fits_one_program
from atom_aot.ops.int4 import GROUP

FP8_SCHEMES = ("fp8", "fp8-static", "fp8-block", "fp8-ub")
INT8_SCHEMES = ("int8", "int8-static")
INT4_SCHEMES = ("int4-w4a16", "int4-w4a16-channel")


def linear_op(scheme: str) -> str:
    """The backend op (ops/backends) that runs a quantized scheme's GEMM."""
    if scheme in INT4_SCHEMES:
        return "int4_linear"
    return "int8_linear" if scheme in INT8_SCHEMES else "fp8_linear"


def int4_groups(scheme: str, in_features: int) -> int:
    """G, the number of scale/zero groups along K of an int4 layer."""
    return 1 if scheme == "int4-w4a16-channel" else -(-in_features // GROUP)


class QuantizedInput(NamedTuple):
    """A linear's input quantized before it (per-token e4m3, by an RMSNorm's rms_norm_quant backend)."""
    q: torch.Tensor           # [T, K] e4m3
    scale: torch.Tensor       # [T, 1] float32
    dtype: torch.dtype        # the activations' dtype: the linear's output dtype


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
        # the quantizer of an input made by a SiLU-mul (GatedMLP's down projection calls forward_silu_mul), where
        # the phase's row names one (use_linear_kernels)
        self.silu_mul_quant = None

    def forward(self, x: torch.Tensor | QuantizedInput) -> torch.Tensor:
        # x: [T, K] -> [T, N]
        if isinstance(x, QuantizedInput):        # the norm before it quantized it (use_linear_kernels)
            return self.gemm.quantized(x.q, x.scale, self.weight, self.weight_scale, self.bias, x.dtype)
        if self.activation_scale_ub is not None:
            bound = self.activation_scale_ub.to(x.dtype)                 # [1]
            x = torch.clamp(x, min=-bound, max=bound)
        return self.gemm(x, self.weight, self.weight_scale, self.input_scale, self.bias)

    def forward_silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """This layer on silu(gate) * up of gate_up [T, 2K] (gate first), quantized by `silu_mul_quant` (set)."""
        xq, x_scale = self.silu_mul_quant(gate_up)                         # [T, K] e4m3, [T, 1]
        return self.gemm.quantized(xq, x_scale, self.weight, self.weight_scale, self.bias, gate_up.dtype)


def takes_quantized_input(layer: nn.Module) -> bool:
    """Whether `layer`'s input may come quantized from a silu_mul_quant or rms_norm_quant backend: per-channel
    weights and dynamic per-token activations (the `fp8` scheme)."""
    return isinstance(layer, Fp8Linear) and layer.scheme == "fp8"


def quantizes_silu_mul(layer: nn.Module) -> bool:
    """Whether `layer` (a GatedMLP's down projection) takes its SiLU-mul input through a silu_mul_quant backend."""
    return getattr(layer, "silu_mul_quant", None) is not None


class Int8Linear(nn.Module):
    """y = x W^T (+ b) with W and x in int8 and exact integer accumulation (layouts: module docstring)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype, scheme: str = "int8"):
        super().__init__()
        if scheme not in INT8_SCHEMES:
            raise ValueError(f"unknown int8 scheme {scheme!r}; known: {', '.join(INT8_SCHEMES)}")
        self.scheme = scheme
        self.weight = _frozen(out_features, in_features, dtype=torch.int8)
        self.weight_scale = _frozen(out_features, dtype=torch.float32)
        self.input_scale = _frozen(1, dtype=torch.float32) if scheme == "int8-static" else None
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        # the aten op (reference on the CPU) until use_linear_kernels sets the phase's choice
        self.gemm = make_backend("int8_linear", BackendChoice("aten"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, K] -> [T, N]
        return self.gemm(x, self.weight, self.weight_scale, self.input_scale, self.bias)


class Int4Linear(nn.Module):
    """y = x W^T (+ b) with W stored as int4 nibbles, zero points and group scales; x as it is (W4A16)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                 scheme: str = "int4-w4a16"):
        super().__init__()
        if scheme not in INT4_SCHEMES:
            raise ValueError(f"unknown int4 scheme {scheme!r}; known: {', '.join(INT4_SCHEMES)}")
        self.scheme = scheme
        groups = int4_groups(scheme, in_features)
        self.weight = _frozen(out_features, -(-in_features // 2), dtype=torch.uint8)
        self.weight_scale = _frozen(out_features, groups, dtype=torch.float32)
        self.weight_zero = _frozen(out_features, groups, dtype=torch.uint8)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        # the aten op (reference on the CPU) until use_linear_kernels sets the phase's choice
        self.gemm = make_backend("int4_linear", BackendChoice("aten"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [T, K] -> [T, N]
        return self.gemm(x, self.weight, self.weight_scale, self.weight_zero, self.bias)


LINEAR_CLASSES = {"fp8_linear": Fp8Linear, "int8_linear": Int8Linear, "int4_linear": Int4Linear}


def make_quantized_linear(in_features: int, out_features: int, bias: bool, dtype: torch.dtype,
                          scheme: str) -> nn.Module:
    return LINEAR_CLASSES[linear_op(scheme)](in_features, out_features, bias, dtype, scheme)


def use_linear_kernels(model: nn.Module, row: PhaseTuning) -> None:
    """Point every quantized linear of `model` at the backend `row` names for its op (a model with
    none asks the row nothing), the `fp8` ones at the row's silu_mul_quant backend, which a GatedMLP's down
    projection uses, and the norms that feed an `fp8` one alone (a module's `quantized_norms()`: the decoder
    layer's) at the row's rms_norm_quant backend (none where the row has no such choice: artifacts built before
    it, the CPU's)."""
    for op, cls in LINEAR_CLASSES.items():
        layers = [m for m in model.modules() if isinstance(m, cls)]
        if layers:
            gemm = make_backend(op, row.op(op))
            for layer in layers:
                layer.gemm = gemm
    per_token = [m for m in model.modules() if takes_quantized_input(m)]
    choice = row.ops.get("silu_mul_quant")
    quantizer = make_backend("silu_mul_quant", choice) if per_token and choice is not None else None
    for layer in per_token:  # the one-pass kernel holds a row in one program: wider inputs keep the plain path
        fits = choice is None or choice.backend != "triton" or fits_one_program(layer.weight.shape[1])
        layer.silu_mul_quant = quantizer if fits else None
    _use_norm_quantizers(model, row)


def _use_norm_quantizers(model: nn.Module, row: PhaseTuning) -> None:
    """Each (norm, linear) pair of the model's `quantized_norms()` gets the row's rms_norm_quant backend where the
    linear takes a quantized input and the backend holds the norm's width; every other pair's norm gets none."""
    choice = row.ops.get("rms_norm_quant")
    quantizer = make_backend("rms_norm_quant", choice) if choice is not None else None
    for module in model.modules():
        for norm, linear in getattr(module, "quantized_norms", lambda: ())():
            fits = choice is None or choice.backend != "triton" or fits_one_program(norm.weight.shape[0])
            norm.quantizer = quantizer if takes_quantized_input(linear) and fits else None
