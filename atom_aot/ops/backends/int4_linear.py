"""The `int4_linear` backends: what runs a W4A16 linear (atom_aot/ops/int4.py), chosen per phase from
tuning.json like fp8_linear's.

`aten`: on the CPU the dispatcher op `atom::int4_linear` (the exact float32 reference); on CUDA the
dequantization written into the graph as torch ops, then cuBLAS (it reads the weight at 16 bits after
unpacking it: a prefill candidate, never a decode one). `triton`: `atom_triton::int4_linear`, the GEMM
that unpacks the nibbles in registers, with the launch config the build measured. `small_m+aten`,
`small_m+triton`: up to `max_m` tokens the small-M kernel (ops/triton/int4_small_m.py: the weight
tiled, split K), `aten` / `triton` above, chosen by token count as fp8_linear's small_m backends are.
"""
from __future__ import annotations

from typing import Optional

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import by_token_count, launch_configs
from atom_aot.ops.backends.fp8_linear import AtenFp8Linear


class AtenInt4Linear(AtenFp8Linear):
    """Called as (x, weight, weight_scale, weight_zero, bias): the same positions as fp8's."""

    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune
        from atom_aot.ops.int4 import int4_linear, int4_linear_dequantized
        self.op, self.inline = int4_linear, int4_linear_dequantized


class TritonInt4Linear:
    def __init__(self, choice: BackendChoice):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton._common import GemmConfig
        self.args = launch_configs(choice, {"int4_gemm": GemmConfig})["int4_gemm"].as_args()

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 weight_zero: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return torch.ops.atom_triton.int4_linear(x, weight, weight_scale, weight_zero, bias, *self.args)


class SmallMInt4Linear:
    """int4 linears: the small-M kernel up to max_m tokens, `large` (aten or triton) above."""

    def __init__(self, choice: BackendChoice, large: str):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton._common import GemmConfig, SmallMConfig
        expected = {"int4_small_m": SmallMConfig, **({"int4_gemm": GemmConfig} if large == "triton" else {})}
        configs = launch_configs(choice, expected)
        self.small = configs["int4_small_m"]
        self.large = (TritonInt4Linear(BackendChoice("triton", {"int4_gemm": choice.params["int4_gemm"]}))
                      if large == "triton" else AtenInt4Linear(BackendChoice("aten")))

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 weight_zero: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        def small(x, weight, weight_scale, weight_zero, bias):
            return torch.ops.atom_triton.int4_linear_small_m(x, weight, weight_scale, weight_zero, bias,
                                                             *self.small.as_args())

        return by_token_count(x.shape[0], self.small.max_m, small, self.large, (x, weight, weight_scale, weight_zero),
                              bias)


def small_m_over_aten(choice: BackendChoice) -> SmallMInt4Linear:
    return SmallMInt4Linear(choice, large="aten")


def small_m_over_triton(choice: BackendChoice) -> SmallMInt4Linear:
    return SmallMInt4Linear(choice, large="triton")
