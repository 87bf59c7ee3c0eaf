"""DeepSeek's decoder layer: the dense decoder layer's structure and forward, with latent
attention and, from `first_k_dense_replace` on, DeepSeek's MoE."""
from __future__ import annotations

import torch
from torch import nn

from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import DecoderLayer, GatedMLP
from atom_aot.models.deepseek_moe import DeepseekMoE
from atom_aot.models.layers import RMSNorm
from atom_aot.models.mla import MLAAttention
from atom_aot.models.parallel import ONE_RANK, Split


class DeepseekDecoderLayer(DecoderLayer):
    """The dense decoder layer's structure and forward with latent attention and, from
    `first_k_dense_replace` on, DeepSeek's MoE."""

    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, quant: str, split: Split = ONE_RANK):
        nn.Module.__init__(self)      # DecoderLayer's own __init__ builds the dense modules
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = MLAAttention(cfg, layer, dtype, quant, split.tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = (DeepseekMoE(cfg, dtype, quant, split) if cfg.is_moe_layer(layer)
                    else GatedMLP(cfg, dtype, quant, split.tp))
