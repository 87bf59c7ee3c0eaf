"""Tiny random GLM-4-MoE checkpoints (HF folders, float32) of GLM-4.5-Air's structure: partial rotary on half of
each head, q/k/v biases, a dense first layer, then sigmoid-routed experts with a correction bias and a shared
expert, and one MTP layer stored after the decoder's (as GLM-4.5 ships it; transformers and atom-aot skip it)."""
from __future__ import annotations

from pathlib import Path

from deepseek_factories import make_tiny_routed_moe

TINY_GLM_AIR = dict(
    hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, first_k_dense_replace=1,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, partial_rotary_factor=0.5, attention_bias=True,
    use_qk_norm=False, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
    routed_scaling_factor=1.0, norm_topk_prob=True, max_position_embeddings=512, rms_norm_eps=1e-5,
    rope_theta=10000.0, num_nextn_predict_layers=1, tie_word_embeddings=False)
# GLM-4.5's differences from Air, small: QK-norm, more dense layers, routed scaling 2.5; and grouped routing
TINY_GLM_45 = dict(TINY_GLM_AIR, use_qk_norm=True, num_hidden_layers=4, first_k_dense_replace=2, n_routed_experts=12,
                   num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5)


def make_tiny_glm(out: Path, seed: int = 0, **overrides) -> Path:
    """A random Glm4MoeForCausalLM folder whose safetensors also hold `num_nextn_predict_layers` MTP layers."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM
    return make_tiny_routed_moe(out, Glm4MoeConfig, Glm4MoeForCausalLM, {**TINY_GLM_AIR, **overrides}, seed)
