"""The DeepSeek-V2/V3 facts our modules read beyond the dense ones: the latent-attention ranks,
the MoE routing and the MTP layer count, parsed from the same Hugging Face config.json."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeepseekFields:
    q_lora_rank: int | None          # None: q is one projection (q_proj), as in V2-Lite
    kv_lora_rank: int                # the latent c_kv's width: what the cache stores per token (+ rope)
    qk_nope_head_dim: int
    qk_rope_head_dim: int            # the decoupled, roped part of q and k (k's is shared by all heads)
    v_head_dim: int
    n_shared_experts: int            # experts count, top-k, sizes, norm_topk_prob and the dense first layers:
    n_group: int                     # ModelConfig's MoE fields
    topk_group: int
    routed_scaling_factor: float
    num_nextn_predict_layers: int    # MTP layers stored after the decoder's layers

    def __post_init__(self):
        if not 0 < self.topk_group <= self.n_group:
            raise ValueError(f"topk_group ({self.topk_group}) must be in 1..n_group ({self.n_group})")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Width of one cached token: the normalized c_kv, then the roped k_pe."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @classmethod
    def from_hf_dict(cls, d: dict) -> "DeepseekFields":
        scoring = d.get("scoring_func", "sigmoid")
        if scoring != "sigmoid" or d.get("topk_method", "noaux_tc") != "noaux_tc":
            raise ValueError(f"DeepSeek routing scoring_func={scoring!r}, topk_method={d.get('topk_method')!r} is "
                             f"not supported; supported: sigmoid scoring with noaux_tc (DeepSeek-V3/R1)")
        if d.get("rope_interleave", True) is not True:
            raise ValueError("DeepSeek configs with rope_interleave=false are not supported")
        n_group = d.get("n_group") or 1
        if d["n_routed_experts"] % n_group:
            raise ValueError(f"n_routed_experts ({d['n_routed_experts']}) must be a multiple of n_group ({n_group})")
        return cls(
            q_lora_rank=d.get("q_lora_rank"), kv_lora_rank=d["kv_lora_rank"],
            qk_nope_head_dim=d["qk_nope_head_dim"], qk_rope_head_dim=d["qk_rope_head_dim"],
            v_head_dim=d["v_head_dim"], n_shared_experts=d.get("n_shared_experts") or 0, n_group=n_group,
            topk_group=d.get("topk_group") or 1, routed_scaling_factor=float(d.get("routed_scaling_factor", 1.0)),
            num_nextn_predict_layers=d.get("num_nextn_predict_layers") or 0)
