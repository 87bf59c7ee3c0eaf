"""The `moe` backends: what runs `fused_moe` (see atom_aot/ops/moe.py for the contract).

`reference` calls the `atom::fused_moe` op (torch, CPU). `triton` calls `atom_triton::fused_moe`
with the launch configs the build measured per token-count bucket: tuning.json's params hold one
entry per bucket, `fused_moe@<first token count of the bucket>` -> [BLOCK_M, BLOCK_N, BLOCK_K,
GROUP_M, num_warps, num_stages]; the op picks the bucket from T when it runs (never autotunes).
"""
from __future__ import annotations

import re
from typing import Protocol

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.errors import ArtifactError
from atom_aot.ops.backends.base import launch_configs

BUCKET_KEY = re.compile(r"fused_moe@([1-9][0-9]*)")
NUM_LAUNCH_PARAMS = 6        # BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages


class MoEBackend(Protocol):
    """(hidden [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights [T, k] f32, topk_ids [T, k] i32) -> [T, H];
    fp8 experts pass their row scales w13_scale [E, 2I] and w2_scale [E, H] (ops/moe.py)."""

    def __call__(self, hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, w13_scale: torch.Tensor | None = None,
                 w2_scale: torch.Tensor | None = None) -> torch.Tensor: ...


class ReferenceMoE:
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune
        from atom_aot.ops.moe import fused_moe
        self.op = fused_moe

    def __call__(self, hidden, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None):
        return self.op(hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale)


def bucket_table(choice: BackendChoice) -> tuple[int, ...]:
    """The params as the op's flat table: per bucket (ascending), its first token count then its 6 ints.

    The first bucket must start at 1 token, so every T has a config.
    """
    buckets, problems = {}, []
    for key, values in choice.params.items():
        match = BUCKET_KEY.fullmatch(key)
        if match is None:
            problems.append(f"params[{key!r}] is not 'fused_moe@<tokens>'")
        elif len(values) != NUM_LAUNCH_PARAMS or min(values) < 1:
            problems.append(f"params[{key!r}] must be 6 positive ints [BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, "
                            f"num_warps, num_stages], got {list(values)}")
        else:
            buckets[int(match.group(1))] = tuple(values)
    if 1 not in buckets:
        problems.append("no bucket starts at 1 token ('fused_moe@1')")
    if problems:
        raise ArtifactError(f"tuning.json: the {choice.backend!r} moe backend cannot use these params: "
                            f"{'; '.join(problems)}. Rebuild the artifact with this atom-aot's atom-build.")
    return tuple(v for start in sorted(buckets) for v in (start, *buckets[start]))


class TritonMoE:
    def __init__(self, choice: BackendChoice):
        self.table = list(bucket_table(choice))
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        self.op = torch.ops.atom_triton.fused_moe

    def __call__(self, hidden, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None):
        return self.op(hidden, w13, w2, topk_weights, topk_ids, self.table, w13_scale, w2_scale)
