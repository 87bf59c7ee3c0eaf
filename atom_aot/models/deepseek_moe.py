"""DeepSeek-V3's MoE block: sigmoid scores with a per-expert correction bias, grouped top-k,
routed scaling, plus shared experts (a dense gated MLP added to the routed output). Kimi-K2's and GLM-4.5's
MoE layers are this block too (its config fields: models/grouped_moe_config.py).

The routing is DeepSeek's own (ops/moe.py `grouped_sigmoid_topk`, exactly HF's DeepseekV3TopkRouter, run by
the experts' `moe` backend: one Triton kernel on GPUs); the routed experts are the shared `MoEExperts`
(atom_aot/models/moe.py: the `atom::fused_moe` op through the tuning row's `moe` backend). With data-parallel
attention (`dp` ranks, each holding E/dp routed experts) the routed part gathers every rank's tokens and
reduce-scatters the sums, as SparseMoeBlock does; the shared experts, whole on every rank, run on the rank's own
tokens.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import GatedMLP
from atom_aot.models.moe import MoEExperts
from atom_aot.models.parallel import (ONE_RANK, Split, defer_reduction, gather_ranks_tokens, reduce_partial_sums,
                                      scatter_token_sums)
from atom_aot.ops.moe import GroupedTopK


class DeepseekRouter(nn.Module):
    """The checkpoint's `mlp.gate`: scoring weights (unquantized: they decide the experts) and the
    float32 per-expert bias that only steers the choice."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, dtype=dtype))
        self.e_score_correction_bias = nn.Parameter(torch.empty(cfg.num_experts, dtype=torch.float32))


class DeepseekMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: str, split: Split = ONE_RANK):
        """Over `split.tp` ranks the routed experts split like any MoE layer's (width, or whole under `ep`)
        and the shared experts like a dense MLP; their partial sums are added and all-reduced once (or, with
        `defer_reduce`, by the next RMSNorm)."""
        super().__init__()
        self.config, self.dp, self.tp = cfg, split.dp, split.tp
        self.gate = DeepseekRouter(cfg, dtype)
        grouped = cfg.grouped_moe
        self.routing = GroupedTopK(n_group=grouped.n_group, topk_group=grouped.topk_group,
                                   top_k=cfg.num_experts_per_tok, renormalize=cfg.norm_topk_prob,
                                   scaling=grouped.routed_scaling_factor)
        self.experts = MoEExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, dtype, split, quant)
        shared = grouped.shared_width(cfg.moe_intermediate_size)
        self.shared_experts = GatedMLP(cfg, dtype, quant, split.tp, intermediate_size=shared) if shared else None
        if self.shared_experts is not None:
            defer_reduction(self.shared_experts)         # summed with the routed experts' before the all-reduce
        self.defer_reduce = False      # True: the output stays partial sums for the next norm (parallel.py)

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, ids [T, k] int32): DeepSeek's grouped sigmoid top-k (ops/moe.py), run by the
        experts' backend after the router's linear in float32."""
        logits = F.linear(tokens.float(), self.gate.weight.float())                     # [T, E]
        return self.experts.moe_backend.route_grouped(logits, self.gate.e_score_correction_bias, self.routing)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = gather_ranks_tokens(x, self.dp)                              # [dp * T, H]
        weights, ids = self.route(tokens)
        out = scatter_token_sums(self.experts(tokens, weights, ids, deferred=True), self.dp)   # [T, H]: this rank's
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return reduce_partial_sums(out, self.tp, self.defer_reduce)
