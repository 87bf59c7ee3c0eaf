"""The config fields of DeepSeek-V3-style MoE layers, which DeepSeek-V2/V3, Kimi-K2 and GLM-4.5 share: sigmoid
router scores with a per-expert correction bias, grouped top-k (`n_group`, `topk_group`), `routed_scaling_factor`
and shared experts. Parsed from the same Hugging Face config.json as ModelConfig (expert count, top-k, sizes,
`norm_topk_prob` and the dense first layers are ModelConfig's MoE fields)."""
from __future__ import annotations

from dataclasses import dataclass

# the routing these fields describe: sigmoid scores, top-k without auxiliary loss (DeepSeek-V3's names for it)
SCORING_FUNC, TOPK_METHOD = "sigmoid", "noaux_tc"


@dataclass(frozen=True)
class GroupedMoEFields:
    n_shared_experts: int            # dense experts every token goes through: width n_shared * moe_intermediate_size
    n_group: int                     # experts form n_group groups of E / n_group ...
    topk_group: int                  # ... and a token's top-k falls inside its topk_group best groups
    routed_scaling_factor: float     # the routed experts' weights times this

    def __post_init__(self):
        if not 0 < self.topk_group <= self.n_group:
            raise ValueError(f"topk_group ({self.topk_group}) must be in 1..n_group ({self.n_group})")

    @classmethod
    def from_hf_dict(cls, d: dict) -> "GroupedMoEFields":
        scoring, method = d.get("scoring_func", SCORING_FUNC), d.get("topk_method", TOPK_METHOD)
        if scoring != SCORING_FUNC or method != TOPK_METHOD:
            raise ValueError(f"MoE routing scoring_func={scoring!r}, topk_method={method!r} is not supported; "
                             f"supported: {SCORING_FUNC} scoring with {TOPK_METHOD} (DeepSeek-V3/R1, Kimi-K2, GLM-4.5)")
        if (d.get("moe_layer_freq") or 1) != 1:
            raise ValueError(f"moe_layer_freq={d['moe_layer_freq']} is not supported: every layer from "
                             f"first_k_dense_replace on has experts here (as transformers builds them), which is "
                             f"moe_layer_freq 1")
        n_group = d.get("n_group") or 1
        if d["n_routed_experts"] % n_group:
            raise ValueError(f"n_routed_experts ({d['n_routed_experts']}) must be a multiple of n_group ({n_group})")
        return cls(n_shared_experts=d.get("n_shared_experts") or 0, n_group=n_group,
                   topk_group=d.get("topk_group") or 1,
                   routed_scaling_factor=float(d.get("routed_scaling_factor", 1.0)))

    def shared_width(self, moe_intermediate_size: int) -> int:
        """The shared experts' MLP width (0: none)."""
        return self.n_shared_experts * moe_intermediate_size
