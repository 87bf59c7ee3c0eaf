"""Mixtral (8x7B, 8x22B): Llama's attention with top-2 softmax experts, always renormalized (as
Hugging Face's router does). The checkpoint names the block `block_sparse_moe` and the expert
projections w1 (gate), w3 (up), w2 (down)."""
from atom_aot.models.moe import MoEForCausalLM


class MixtralForCausalLM(MoEForCausalLM):
    qk_norm = False
    EXPERT_MODULES = {"w1": ("w13", 0), "w3": ("w13", 1), "w2": ("w2", 0)}
    MODULE_RENAMES = {"block_sparse_moe": "mlp"}

    def routing_renormalizes(self) -> bool:
        return True
