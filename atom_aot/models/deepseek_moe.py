"""DeepSeek-V3's MoE block: sigmoid scores with a per-expert correction bias, grouped top-k,
routed scaling, plus shared experts (a dense gated MLP added to the routed output).

The routing is DeepSeek's own (`deepseek_topk`, exactly HF's DeepseekV3TopkRouter); the routed
experts are the shared `MoEExperts` (atom_aot/models/moe.py: the `atom::fused_moe` op through the
tuning row's `moe` backend). With data-parallel attention (`dp` ranks, each holding E/dp routed
experts) the routed part gathers every rank's tokens and reduce-scatters the sums, as SparseMoeBlock
does; the shared experts, whole on every rank, run on the rank's own tokens.
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


def deepseek_topk(hidden: torch.Tensor, router: "DeepseekRouter", cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert choice per token: (weights [T, k] float32, ids [T, k] int32).

    Experts are chosen by sigmoid score + correction bias, only inside the `topk_group` groups whose
    two best biased scores sum highest; the weights are the unbiased scores, renormalized if
    `norm_topk_prob`, times `routed_scaling_factor`.
    """
    ds = cfg.deepseek
    scores = F.linear(hidden.float(), router.weight.float()).sigmoid()              # [T, E]
    biased = scores + router.e_score_correction_bias
    per_group = biased.unflatten(-1, (ds.n_group, -1))                              # [T, G, E/G]
    group_scores = per_group.topk(2, dim=-1)[0].sum(dim=-1)                         # [T, G]
    group_idx = group_scores.topk(ds.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    expert_mask = group_mask.unsqueeze(-1).expand_as(per_group).flatten(1).bool()  # [T, E]
    ids = biased.masked_fill(~expert_mask, float("-inf")).topk(cfg.num_experts_per_tok, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * ds.routed_scaling_factor, ids.to(torch.int32)


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
        self.experts = MoEExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, dtype, split, quant)
        shared = cfg.moe_intermediate_size * cfg.deepseek.n_shared_experts
        self.shared_experts = GatedMLP(cfg, dtype, quant, split.tp, intermediate_size=shared) if shared else None
        if self.shared_experts is not None:
            defer_reduction(self.shared_experts)         # summed with the routed experts' before the all-reduce
        self.defer_reduce = False      # True: the output stays partial sums for the next norm (parallel.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = gather_ranks_tokens(x, self.dp)                              # [dp * T, H]
        weights, ids = deepseek_topk(tokens, self.gate, self.config)
        out = scatter_token_sums(self.experts(tokens, weights, ids, deferred=True), self.dp)   # [T, H]: this rank's
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return reduce_partial_sums(out, self.tp, self.defer_reduce)
