"""Llama (1-3.x, incl. llama3 RoPE scaling; tied or untied embeddings). SmolLM2 is one too."""
from atom_aot.errors import BuildError
from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    qk_norm = False

    @classmethod
    def layer_window(cls, cfg: ModelConfig, layer: int) -> int | None:
        """transformers' Llama attends over the whole context whatever the config says: a window is refused rather
        than served another way than the reference computes it."""
        if cfg.sliding_window is not None:
            raise BuildError(f"config.json sets sliding_window={cfg.sliding_window}, and transformers' Llama has no "
                             f"sliding window (it would not apply it): remove the field (or set it to null) to build "
                             f"the model as transformers runs it")
        return None
