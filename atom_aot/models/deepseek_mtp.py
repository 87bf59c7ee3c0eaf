"""DeepSeek-V3's multi-token-prediction layer (the checkpoint's layer `num_hidden_layers + i`):
from the main model's hidden state at position p and the token at p + 1, predict the token at
p + 2. What the speculative-decoding proposer drives (docs/deepseek.md).

    h   = eh_proj([enorm(embed(token_{p+1})) ; hnorm(hidden_p)])
    h   = block(h)                      # a full DeepSeek decoder layer, its own cache layer
    out = shared_head.head(shared_head.norm(h))
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from atom_aot.models.config import ModelConfig
from atom_aot.models.deepseek_layer import DeepseekDecoderLayer
from atom_aot.models.layers import RMSNorm, RotaryEmbedding, make_linear
from atom_aot.models.parallel import ONE_RANK, Split
from atom_aot.models.step_inputs import StepInputs


class SharedHead(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.head = make_linear(cfg.hidden_size, cfg.vocab_size, False, dtype, "none")


class MTPLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, cache_layer: int, dtype: torch.dtype, quant: str, split: Split = ONE_RANK):
        """The block splits like a decoder layer; the embedding, eh_proj and shared head are
        whole on every rank (weights/shard.py leaves `mtp.*` outside the vocabulary split)."""
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.eh_proj = make_linear(2 * cfg.hidden_size, cfg.hidden_size, False, dtype, quant)
        self.block = DeepseekDecoderLayer(cfg, cache_layer, dtype, quant, split)
        self.shared_head = SharedHead(cfg, dtype)

    def forward(self, previous_hidden: torch.Tensor, inputs: StepInputs, rotary: RotaryEmbedding):
        """previous_hidden [T, hidden]: the main model's final-normed hidden state at each token's previous
        position; inputs: the step with `input_ids` the next tokens at `positions` (writes this layer's
        cache slots). Returns (float32 logits [N, vocab] at logits_indices, the block's output [T, hidden],
        which a further MTP step takes as its previous_hidden)."""
        embeds = self.enorm(self.embed_tokens(inputs.input_ids))
        h = self.eh_proj(torch.cat([embeds, self.hnorm(previous_hidden)], dim=-1))      # [T, hidden]
        h, residual = self.block(inputs.positions, h, None, rotary, inputs.attention_inputs())
        h = h + residual
        logits = F.linear(self.shared_head.norm(h[inputs.logits_indices]), self.shared_head.head.weight)
        return logits.float(), h


class MTPStep(nn.Module):
    """The MTP proposer's forward as its own module, what the build exports as the `mtp` package.

    It holds the causal LM's `model` (rotary table) and `mtp` modules under the same names, so its
    parameters are the artifact's weights by name: the package binds to the same weights file.
    """

    def __init__(self, causal_lm: nn.Module, depth: int = 0):
        super().__init__()
        self.model, self.mtp, self.depth = causal_lm.model, causal_lm.mtp, depth

    def forward(self, inputs: StepInputs, previous_hidden: torch.Tensor):
        """(float32 logits [N, vocab], hidden [T, hidden]); see MTPLayer.forward."""
        return self.mtp[self.depth](previous_hidden, inputs, self.model.rotary)


class LogitsAndHidden(nn.Module):
    """The target forward a model with MTP layers exports as its mixed and decode packages:
    (float32 logits [N, vocab], final-normed hidden states [T, hidden]); the MTP proposer reads the
    hidden states. Like MTPStep it holds the causal LM's modules under their own names, so the
    packages bind to the artifact's weights by name."""

    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        self.model, self.lm_head = causal_lm.model, causal_lm.lm_head
        self._causal_lm = [causal_lm]        # in a list: not registered a second time as a submodule

    def forward(self, inputs: StepInputs):
        return self._causal_lm[0].logits_and_hidden(inputs)
