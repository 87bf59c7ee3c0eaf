"""Llama (1-3.x, incl. llama3 RoPE scaling; tied or untied embeddings). SmolLM2 is one too."""
from atom_aot.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    qk_norm = False
