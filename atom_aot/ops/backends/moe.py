"""The `moe` backends: what runs `fused_moe` and the routers before it (see atom_aot/ops/moe.py for the contracts).

`reference` calls the `atom::fused_moe` op (torch, CPU). `triton` calls `atom_triton::fused_moe`
with the launch configs the build measured per token-count bucket: tuning.json's params hold one
entry per bucket, `fused_moe@<first token count of the bucket>` -> [BLOCK_M, BLOCK_N, BLOCK_K,
GROUP_M, num_warps, num_stages]; the op picks the bucket from T when it runs (never autotunes); its
routers are `atom_triton::softmax_topk`, `atom_triton::top_k_softmax` and `atom_triton::grouped_sigmoid_topk`
(one kernel each, nothing tuned).

Both take a layer's experts as one `ExpertWeights` (ops/moe.py) and hand its tensors to their op.
"""
from __future__ import annotations

from typing import Protocol

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import bucket_params, launch_configs
from atom_aot.ops.moe import SILU, ExpertActivation, ExpertWeights, GroupedTopK


class MoEBackend(Protocol):
    """(hidden [T, H], experts, topk_weights [T, k] f32, topk_ids [T, k] i32, activation) -> [T, H], the experts
    stored in any format of ops/expert_formats.py (ops/moe.py `ExpertWeights`). Routers: router_logits [T, E] ->
    (weights [T, k] f32, ids [T, k] i32): `route` the softmax top-k (ops/moe.py `softmax_topk`), `route_top_k_softmax`
    GPT-OSS's (`top_k_softmax`), `route_grouped` DeepSeek-V3's (`grouped_sigmoid_topk`, from float32 logits and its
    bias)."""

    def __call__(self, hidden: torch.Tensor, experts: ExpertWeights, topk_weights: torch.Tensor,
                 topk_ids: torch.Tensor, activation: ExpertActivation = SILU) -> torch.Tensor: ...

    def route(self, router_logits: torch.Tensor, top_k: int,
              renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]: ...

    def route_top_k_softmax(self, router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def route_grouped(self, router_logits: torch.Tensor, correction_bias: torch.Tensor,
                      routing: GroupedTopK) -> tuple[torch.Tensor, torch.Tensor]: ...


class ReferenceMoE:
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune
        from atom_aot.ops.moe import fused_moe, grouped_sigmoid_topk, softmax_topk, top_k_softmax
        self.op, self.route, self.route_grouped = fused_moe, softmax_topk, grouped_sigmoid_topk
        self.route_top_k_softmax = top_k_softmax

    def __call__(self, hidden, experts, topk_weights, topk_ids, activation=SILU):
        return self.op(hidden, experts.w13, experts.w2, topk_weights, topk_ids, *experts.optional(),
                       activation.kind, activation.alpha, activation.limit)


def bucket_table(choice: BackendChoice) -> tuple[int, ...]:
    """The params as the op's flat table: per bucket (ascending), its first token count then its 6 ints."""
    return bucket_params(choice, "fused_moe", "BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages")


class TritonMoE:
    def __init__(self, choice: BackendChoice):
        self.table = list(bucket_table(choice))
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        self.op = torch.ops.atom_triton.fused_moe

    def __call__(self, hidden, experts, topk_weights, topk_ids, activation=SILU):
        return self.op(hidden, experts.w13, experts.w2, topk_weights, topk_ids, self.table, *experts.optional(),
                       activation.kind, activation.alpha, activation.limit)

    def route(self, router_logits, top_k, renormalize):
        return torch.ops.atom_triton.softmax_topk(router_logits, top_k, renormalize)

    def route_top_k_softmax(self, router_logits, top_k):
        return torch.ops.atom_triton.top_k_softmax(router_logits, top_k)

    def route_grouped(self, router_logits, correction_bias, routing):
        return torch.ops.atom_triton.grouped_sigmoid_topk(
            router_logits, correction_bias, n_group=routing.n_group, topk_group=routing.topk_group,
            top_k=routing.top_k, renormalize=routing.renormalize, scaling=routing.scaling)
