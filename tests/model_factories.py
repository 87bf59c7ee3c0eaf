"""A tiny decoder built in memory with random weights (no checkpoint, no build), for tests of the
model's forward and its attention backends."""
from __future__ import annotations

import torch

from atom_aot.artifact.phase import Phase
from atom_aot.build.export import example_inputs
from atom_aot.models import ModelConfig, model_class
from atom_aot.models.step_inputs import StepInputs
from atom_aot.ops.rope import rope_cos_sin_cache

TINY_QWEN3 = dict(architectures=["Qwen3ForCausalLM"], vocab_size=64, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=128)


def randomize(model, seed: int):
    """Every parameter drawn from `seed`: norm weights near 1, the rest small."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else 0.1 * noise)
    return model


def tiny_model(seed: int = 0, quant: str = "none", **overrides):
    """A float32 model whose weights are drawn from `seed` (norm weights near 1); `quant`: its linear scheme
    (quantized parameters drawn like the rest: for tests of shapes and graphs, not of numerics)."""
    cfg = ModelConfig.from_hf_dict({**TINY_QWEN3, **overrides})
    model = randomize(model_class(cfg.architecture)(cfg, torch.float32, quant), seed)
    with torch.no_grad():
        model.model.rotary.cos_sin_cache.copy_(rope_cos_sin_cache(cfg.head_dim, cfg.rope_theta, {},
                                                                  cfg.max_position_embeddings))
    return model.eval()


def mixed_step(model, block_size: int = 16) -> StepInputs:
    """3 prompts of 5, 4 and 2 tokens into a zeroed cache (the export's example step)."""
    torch.manual_seed(0)
    return example_inputs(model, torch.float32, block_size, torch.device("cpu"), Phase.MIXED)
