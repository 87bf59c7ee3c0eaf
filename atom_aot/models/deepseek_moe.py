"""DeepSeek-V3's MoE block: sigmoid scores with a per-expert correction bias, grouped top-k,
routed scaling, plus shared experts (a dense gated MLP added to the routed output).

The routing is DeepSeek's own (`deepseek_topk`, exactly HF's DeepseekV3TopkRouter); the routed
experts run through `routed_experts`, the one call site of the experts op.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from atom_aot.models.config import ModelConfig
from atom_aot.models.deepseek_config import DeepseekFields
from atom_aot.models.decoder import GatedMLP


def deepseek_topk(hidden: torch.Tensor, gate_weight: torch.Tensor, correction_bias: torch.Tensor,
                  ds: DeepseekFields) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert choice per token: (weights [T, k] float32, ids [T, k] int32).

    Experts are chosen by sigmoid score + correction bias, only inside the `topk_group` groups whose
    two best biased scores sum highest; the weights are the unbiased scores, renormalized if
    `norm_topk_prob`, times `routed_scaling_factor`.
    """
    scores = F.linear(hidden.float(), gate_weight.float()).sigmoid()             # [T, E]
    biased = scores + correction_bias
    per_group = biased.unflatten(-1, (ds.n_group, -1))                            # [T, G, E/G]
    group_scores = per_group.topk(2, dim=-1)[0].sum(dim=-1)                       # [T, G]
    group_idx = group_scores.topk(ds.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    expert_mask = group_mask.unsqueeze(-1).expand_as(per_group).flatten(1).bool()  # [T, E]
    ids = biased.masked_fill(~expert_mask, float("-inf")).topk(ds.num_experts_per_tok, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if ds.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * ds.routed_scaling_factor, ids.to(torch.int32)


def routed_experts(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor) -> torch.Tensor:
    """sum_k weight[t, k] * expert_{id[t, k]}(x[t]) over hidden [T, H]; w13 [E, 2I, H], w2 [E, H, I].

    The experts op's signature (ids < 0 skipped); runs in torch until the shared MoE op lands.
    """
    out = torch.zeros_like(hidden)
    for expert in torch.unique(topk_ids[topk_ids >= 0]).tolist():
        tokens, slot = torch.where(topk_ids == expert)
        gate, up = F.linear(hidden[tokens], w13[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[expert]) * topk_weights[tokens, slot, None]
        out.index_add_(0, tokens, y.to(out.dtype))
    return out


class DeepseekMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: str):
        super().__init__()
        ds, hidden = cfg.deepseek, cfg.hidden_size
        self.fields = ds
        self.gate_weight = nn.Parameter(torch.empty(ds.n_routed_experts, hidden, dtype=dtype))
        self.e_score_correction_bias = nn.Parameter(torch.empty(ds.n_routed_experts, dtype=torch.float32))
        self.w13 = nn.Parameter(torch.empty(ds.n_routed_experts, 2 * ds.moe_intermediate_size, hidden, dtype=dtype))
        self.w2 = nn.Parameter(torch.empty(ds.n_routed_experts, hidden, ds.moe_intermediate_size, dtype=dtype))
        self.shared_experts = (GatedMLP(cfg, dtype, quant, ds.moe_intermediate_size * ds.n_shared_experts)
                               if ds.n_shared_experts else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = deepseek_topk(x, self.gate_weight, self.e_score_correction_bias, self.fields)
        out = routed_experts(x, self.w13, self.w2, weights, ids)
        return out if self.shared_experts is None else out + self.shared_experts(x)
