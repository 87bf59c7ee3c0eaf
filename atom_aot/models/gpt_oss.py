"""GPT-OSS (gpt-oss-20b, gpt-oss-120b): Llama's attention with biases, a learned sink logit per head, and
sliding-window layers alternating with full ones (`layer_types`); every layer's feed-forward block is a mixture
of experts routed by the top k of a biased router's logits (a softmax over those k), whose experts have biases
and a clamped SwiGLU: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).

The checkpoint (transformers' GptOssExperts) stores each layer's experts transposed and with gate and up
interleaved: `experts.gate_up_proj [E, H, 2I]` (columns gate0, up0, gate1, up1, ...), `gate_up_proj_bias [E, 2I]`,
`down_proj [E, I, H]`, `down_proj_bias [E, H]`; `adapt_checkpoint` turns them into the stacks of ops/moe.py
(`w13 [E, 2I, H]`, gate's rows then up's; `w2 [E, H, I]`) as they stream in. docs/gpt-oss.md.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import torch

from atom_aot.errors import BuildError
from atom_aot.models.config import ModelConfig
from atom_aot.models.moe import MoEBlockSpec, MoEForCausalLM
from atom_aot.models.parallel import ONE_RANK, Split
from atom_aot.ops.moe import ExpertActivation

DEFAULT_SWIGLU_ALPHA, DEFAULT_SWIGLU_LIMIT = 1.702, 7.0     # transformers' GptOssConfig defaults
# checkpoint name of a layer's expert tensor -> (the name it goes on under, how it becomes ours)
EXPERT_TENSORS = {
    "gate_up_proj": ("w13", lambda t: gate_then_up(t.transpose(1, 2), dim=1)),    # [E, H, 2I] -> [E, 2I, H]
    "gate_up_proj_bias": ("w13_bias", lambda t: gate_then_up(t, dim=1)),          # [E, 2I]
    "down_proj": ("w2", lambda t: t.transpose(1, 2)),                              # [E, I, H] -> [E, H, I]
    "down_proj_bias": ("w2_bias", lambda t: t),                                    # [E, H]
    # MXFP4 checkpoints store the stacks as they are multiplied (rows = outputs), only gate/up interleaved; they
    # keep their names for the build's expert stacker (weights/experts.py), rows reordered
    "gate_up_proj_blocks": ("gate_up_proj_blocks", lambda t: gate_then_up(t, dim=1)),   # [E, 2I, H/32, 16]
    "gate_up_proj_scales": ("gate_up_proj_scales", lambda t: gate_then_up(t, dim=1)),   # [E, 2I, H/32]
    "down_proj_blocks": ("down_proj_blocks", lambda t: t),
    "down_proj_scales": ("down_proj_scales", lambda t: t),
}


def gate_then_up(interleaved: torch.Tensor, dim: int) -> torch.Tensor:
    """GPT-OSS's interleaved gate/up entries along `dim` (gate0, up0, gate1, ...) as gate's entries, then up's."""
    pairs = interleaved.unflatten(dim, (-1, 2))                         # [..., I, 2, ...]
    return torch.cat([pairs.select(dim + 1, 0), pairs.select(dim + 1, 1)], dim=dim).contiguous()


class GptOssForCausalLM(MoEForCausalLM):
    qk_norm = False
    attention_sinks = True
    MODULE_RENAMES = {"router": "gate"}

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: str = "none", max_positions: int | None = None,
                 split: Split = ONE_RANK):
        if not cfg.num_experts:
            raise BuildError("a GPT-OSS config.json needs num_local_experts and num_experts_per_tok")
        super().__init__(cfg, dtype, quant, max_positions, split)

    def moe_block_spec(self) -> MoEBlockSpec:
        """transformers' defaults where the config has no swiglu fields (the released configs give the limit only)."""
        cfg = self.config
        alpha = DEFAULT_SWIGLU_ALPHA if cfg.swiglu_alpha is None else cfg.swiglu_alpha
        limit = DEFAULT_SWIGLU_LIMIT if cfg.swiglu_limit is None else cfg.swiglu_limit
        return MoEBlockSpec(top_k_first=True, router_bias=True, expert_bias=True,
                            activation=ExpertActivation("swiglu_clamped", alpha, limit))

    @classmethod
    def layer_window(cls, cfg: ModelConfig, layer: int) -> int | None:
        """The config's layer_types; without them transformers' default: even layers slide, odd ones are full."""
        if cfg.sliding_window is not None and cfg.layer_types is None:
            return cfg.sliding_window if layer % 2 == 0 else None
        return super().layer_window(cfg, layer)

    @classmethod
    def adapt_checkpoint(cls, cfg: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]]
                         ) -> Iterator[tuple[str, torch.Tensor]]:
        """Each layer's experts in our stacks' layout (module docstring); everything else as it is."""
        for name, tensor in tensors:
            block, found, leaf = name.rpartition(".experts.")
            if not found:
                yield name, tensor
            elif leaf in EXPERT_TENSORS:
                target, convert = EXPERT_TENSORS[leaf]
                yield f"{block}.experts.{target}", convert(tensor)
            else:
                raise BuildError(f"{name}: not an expert tensor of transformers' GptOssExperts "
                                 f"({', '.join(EXPERT_TENSORS)})")
