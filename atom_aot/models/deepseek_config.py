"""The DeepSeek-V2/V3 facts our modules read beyond the dense ones: the latent-attention ranks, parsed from the
same Hugging Face config.json (the MoE routing is ModelConfig's `grouped_moe`, the MTP layer count its
`num_nextn_predict_layers`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeepseekFields:
    q_lora_rank: int | None          # None: q is one projection (q_proj), as in V2-Lite
    kv_lora_rank: int                # the latent c_kv's width: what the cache stores per token (+ rope)
    qk_nope_head_dim: int
    qk_rope_head_dim: int            # the decoupled, roped part of q and k (k's is shared by all heads)
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Width of one cached token: the normalized c_kv, then the roped k_pe."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @classmethod
    def from_hf_dict(cls, d: dict) -> "DeepseekFields":
        if d.get("rope_interleave", True) is not True:
            raise ValueError("DeepSeek configs with rope_interleave=false are not supported")
        partial = (d.get("rope_parameters") or {}).get("partial_rotary_factor", d.get("partial_rotary_factor"))
        if partial not in (None, 1, 1.0):
            raise ValueError(f"partial_rotary_factor={partial} is not supported for latent attention: its rope "
                             f"part is qk_rope_head_dim wide, roped whole")
        return cls(
            q_lora_rank=d.get("q_lora_rank"), kv_lora_rank=d["kv_lora_rank"],
            qk_nope_head_dim=d["qk_nope_head_dim"], qk_rope_head_dim=d["qk_rope_head_dim"],
            v_head_dim=d["v_head_dim"])
