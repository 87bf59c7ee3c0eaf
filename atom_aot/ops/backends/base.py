"""What every attention backend takes and gives: one typed bundle per layer call, out [T, H, D].

A backend is built once per phase from the tuning row's `BackendChoice` (its name picks the
registry entry, its params are the launch parameters the build measured) and then called by every
attention layer of the model with that layer's `AttentionArgs`. Below them, what every backend shares:
its launch configs from the row's params, and the choice by token count of the small_m linears.
"""
from __future__ import annotations

import re

from dataclasses import dataclass, fields
from typing import NamedTuple, Protocol

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.errors import ArtifactError


class AttentionInputs(NamedTuple):
    """What every attention layer reads for one step (layout: atom_aot/ops/attention.py)."""
    kv_cache: torch.Tensor         # [L, 2, num_blocks, block_size, Hkv, D], written in place
    slot_mapping: torch.Tensor     # [T] int64, -1: padding (not written)
    block_tables: torch.Tensor     # [B, max_blocks] int32
    seq_lens: torch.Tensor         # [B] int32
    query_start_loc: torch.Tensor  # [B + 1] int32


@dataclass(frozen=True)
class QKNorm:
    """Per-head RMSNorm of q and k before rope (Qwen3)."""
    q_weight: torch.Tensor         # [D]
    k_weight: torch.Tensor         # [D]
    eps: float


@dataclass(frozen=True)
class AttentionArgs:
    """One attention layer's call: project-side tensors in, the step's paged-cache inputs alongside."""
    layer: int                     # index into kv_cache's first dimension
    q: torch.Tensor                # [T, H, D] (views of the fused qkv output are fine)
    k: torch.Tensor                # [T, Hkv, D]
    v: torch.Tensor                # [T, Hkv, D]
    positions: torch.Tensor        # [T] int64
    cos_sin_cache: torch.Tensor    # [P, D] float32: cos | sin
    qk_norm: QKNorm | None
    scale: float
    inputs: AttentionInputs
    kv_scale: torch.Tensor | None = None   # [2] float32 (k, v) when the cache is fp8 (ops/attention.py)
    sinks: torch.Tensor | None = None      # [H]: the layer's per-head sink logits (GPT-OSS; ops/attention.py)
    sliding_window: int | None = None      # the layer sees the last this many keys (itself included); None: all


class AttentionBackend(Protocol):
    """QK-norm (if any), rope, KV-cache write and paged attention of one layer: returns out [T, H, D]."""

    def __call__(self, args: AttentionArgs) -> torch.Tensor: ...


def launch_configs(choice: BackendChoice, expected: dict[str, type]) -> dict[str, object]:
    """The launch configs of `choice`, one per kernel the backend runs, each built from its ints.

    `expected` maps kernel name -> config dataclass; a missing, extra or malformed entry means the
    artifact was built by another atom-aot.
    """
    configs, unknown = {}, sorted(set(choice.params) - set(expected))
    problems = [f"params[{kernel!r}] is not a kernel of this backend" for kernel in unknown]
    for kernel, config_type in expected.items():
        names = [f.name for f in fields(config_type)]
        values = choice.params.get(kernel)
        if values is None or len(values) != len(names):
            problems.append(f"params[{kernel!r}] must be [{', '.join(names)}], got {values}")
        else:
            configs[kernel] = config_type(*values)
    if problems:
        raise ArtifactError(f"tuning.json: the {choice.backend!r} backend cannot use these params: "
                            f"{'; '.join(problems)}. Rebuild the artifact with this atom-aot's atom-build.")
    return configs


def bucket_params(choice: BackendChoice, kernel: str, names: str) -> tuple[int, ...]:
    """`choice`'s per-bucket launch configs, `<kernel>@<first count>` -> [names...], as an op's flat table: per
    bucket (ascending), its first count then its ints. The first bucket must start at 1, so every count has a
    config (the build measures one per bucket: docs/kernels.md)."""
    width = len(names.split(","))
    key = re.compile(re.escape(kernel) + r"@([1-9][0-9]*)")
    buckets, problems = {}, []
    for name, values in choice.params.items():
        match = key.fullmatch(name)
        if match is None:
            problems.append(f"params[{name!r}] is not '{kernel}@<count>'")
        elif len(values) != width or min(values) < 1:
            problems.append(f"params[{name!r}] must be {width} positive ints [{names}], got {list(values)}")
        else:
            buckets[int(match.group(1))] = tuple(values)
    if 1 not in buckets:
        problems.append(f"no bucket starts at 1 ('{kernel}@1')")
    if problems:
        raise ArtifactError(f"tuning.json: the {choice.backend!r} backend cannot use these params: "
                            f"{'; '.join(problems)}. Rebuild the artifact with this atom-aot's atom-build.")
    return tuple(v for start in sorted(buckets) for v in (start, *buckets[start]))


def by_token_count(m, max_m: int, small, large, tensors: tuple, bias):
    """small(*tensors, bias) up to max_m tokens, large(*tensors, bias) above: a Python branch on a
    concrete M (eager: the build's timing, tests), `torch.cond` on an exported graph's symbolic one
    (the package holds both and runs one per call; a captured CUDA graph has one M, so one side)."""
    if isinstance(m, int):
        return (small if m <= max_m else large)(*tensors, bias)
    n = len(tensors)

    def with_bias(fn):                     # torch.cond's operands are tensors: an absent bias is left out
        return lambda *ops: fn(*ops[:n], ops[n] if len(ops) > n else None)
    operands = tensors + (() if bias is None else (bias,))
    return torch.cond(m <= max_m, with_bias(small), with_bias(large), operands)
