"""A tiny DeepSeek-V3 module built in memory with random weights (no checkpoint, no build), and
hand-made steps over its latent cache, for tests of its attention backends."""
from __future__ import annotations

import torch

from atom_aot.models import ModelConfig, model_class
from atom_aot.models.step_inputs import StepInputs
from atom_aot.ops.rope import rope_cos_sin_cache
from deepseek_factories import TINY_DEEPSEEK
from model_factories import randomize


def random_deepseek(seed: int = 0):
    cfg = ModelConfig.from_hf_dict({**TINY_DEEPSEEK, "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 64})
    model = randomize(model_class(cfg.architecture)(cfg, torch.float32), seed)
    with torch.no_grad():
        model.model.rotary.cos_sin_cache.copy_(rope_cos_sin_cache(
            cfg.deepseek.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling_dict, cfg.max_position_embeddings))
    return model.eval()


def step_of(kv_cache, tokens: list[list[int]], starts: list[int], block_size: int = 16) -> StepInputs:
    """Sequence b computes tokens[b] at positions starts[b].. ; its blocks are 4b, 4b + 1, ... ."""
    positions = torch.cat([torch.arange(s, s + len(t)) for s, t in zip(starts, tokens)])
    rows = torch.repeat_interleave(torch.arange(len(tokens)), torch.tensor([len(t) for t in tokens]))
    tables = (torch.arange(len(tokens))[:, None] * 4 + torch.arange(4)).to(torch.int32)
    slots = tables[rows, positions // block_size].long() * block_size + positions % block_size
    counts = torch.tensor([0] + [len(t) for t in tokens]).cumsum(0)
    dev = kv_cache.device                   # the step's tensors live where its cache does (a GPU test's)
    return StepInputs(torch.tensor(sum(tokens, [])).to(dev), positions.to(dev), kv_cache, slots.to(dev), tables.to(dev),
                      torch.tensor([s + len(t) for s, t in zip(starts, tokens)], dtype=torch.int32).to(dev),
                      counts.to(torch.int32).to(dev), (counts[1:] - 1).to(dev))
