"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (QK-norm) with softmax top-k experts,
renormalized when `norm_topk_prob`; `decoder_sparse_step` / `mlp_only_layers` keep some layers dense."""
from atom_aot.models.moe import MoEForCausalLM


class Qwen3MoeForCausalLM(MoEForCausalLM):
    qk_norm = True
