"""Qwen3 dense: Llama's structure plus a per-head RMSNorm on q and k before RoPE, and a
head_dim that need not equal hidden_size / num_heads."""
from atom_aot.models.decoder import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    qk_norm = True
