"""Qwen3 dense: Llama's structure plus a per-head RMSNorm on q and k before RoPE, and a
head_dim that need not equal hidden_size / num_heads."""
from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import DecoderForCausalLM

DEFAULT_MAX_WINDOW_LAYERS = 28     # transformers' Qwen3Config default


class Qwen3ForCausalLM(DecoderForCausalLM):
    qk_norm = True

    @classmethod
    def layer_window(cls, cfg: ModelConfig, layer: int) -> int | None:
        """transformers' Qwen3 rule: with a window (use_sliding_window) and no layer_types, the layers from
        max_window_layers on slide."""
        if cfg.sliding_window is None or cfg.layer_types is not None:
            return super().layer_window(cfg, layer)
        first = DEFAULT_MAX_WINDOW_LAYERS if cfg.max_window_layers is None else cfg.max_window_layers
        return cfg.sliding_window if layer >= first else None
