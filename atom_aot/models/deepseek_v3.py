"""DeepSeek-V3 / R1 (and V2-style configs with the same routing): multi-head latent attention on a
paged latent cache, `first_k_dense_replace` dense layers then DeepSeek MoE layers, and the MTP
layer(s) the checkpoint stores after the decoder's layers (atom_aot/models/deepseek_mtp.py).

The decoder layer's and the model's forward are the dense decoder's (atom_aot/models/decoder.py);
only the modules inside differ. docs/deepseek.md describes the cache layout and what runs where.
"""
from __future__ import annotations

import re
from typing import Collection, Iterable, Iterator

import torch
from torch import nn

from atom_aot.artifact.kv_cache import KVCacheLayout
from atom_aot.artifact.tuning import PhaseTuning
from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import DecoderForCausalLM, DecoderModel
from atom_aot.models.deepseek_layer import DeepseekDecoderLayer
from atom_aot.models.deepseek_mtp import LogitsAndHidden, MTPLayer, MTPStep
from atom_aot.models.layers import RMSNorm, RotaryEmbedding, make_linear
from atom_aot.models.mla import split_kv_b_proj
from atom_aot.models.moe import MoEForCausalLM, use_moe_kernels
from atom_aot.models.parallel import ONE_RANK, Split, check_splittable, make_embedding
from atom_aot.models.step_inputs import StepInputs
from atom_aot.ops.backends import make_backend

LAYER = re.compile(r"model\.layers\.(\d+)\.(.*)$")
# MTP layer tensors that belong to the MTP module itself (the rest are its decoder block's)
MTP_OWN = ("enorm.", "hnorm.", "eh_proj.", "embed_tokens.", "shared_head.")
MTP_OWN_WEIGHTS = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "embed_tokens.weight", "shared_head.norm.weight",
                   "shared_head.head.weight")


class DeepseekModel(DecoderModel):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: str, max_positions: int, split: Split = ONE_RANK):
        nn.Module.__init__(self)      # DecoderModel's own __init__ builds dense layers
        self.embed_tokens = make_embedding(cfg.vocab_size, cfg.hidden_size, dtype, split.tp)
        self.rotary = RotaryEmbedding(cfg.deepseek.qk_rope_head_dim, max_positions)
        self.layers = nn.ModuleList(DeepseekDecoderLayer(cfg, i, dtype, quant, split)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.defer_reductions(split.tp)


class DeepseekV3ForCausalLM(DecoderForCausalLM):
    PACKED_MODULES = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
    EXPERT_MODULES = MoEForCausalLM.EXPERT_MODULES
    ATTENTION_OPS = ("mla_attention",)
    BUILDS_MTP_LAYERS = True
    MTP_CONFIG_FIELD = "num_nextn_predict_layers"

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: str = "none", max_positions: int | None = None,
                 split: Split = ONE_RANK):
        nn.Module.__init__(self)
        check_splittable(cfg, split)
        self.config, self.split = cfg, split
        self.model = DeepseekModel(cfg, dtype, quant, max_positions or cfg.max_position_embeddings, split)
        # lm_head stays unquantized: it decides the argmax. It splits over the vocabulary like the embedding.
        vocab_rows = self.model.embed_tokens.weight.shape[0]
        self.lm_head = None if cfg.tie_word_embeddings else make_linear(cfg.hidden_size, vocab_rows, False,
                                                                        dtype, "none")
        self.mtp = nn.ModuleList(MTPLayer(cfg, cfg.num_hidden_layers + i, dtype, quant, split)
                                 for i in range(cfg.num_nextn_predict_layers))

    @classmethod
    def rotary_dim(cls, cfg: ModelConfig) -> int:
        """The decoupled rope part of q and k (latent attention ropes that part whole)."""
        return cfg.deepseek.qk_rope_head_dim

    @classmethod
    def kv_cache_layout(cls, cfg: ModelConfig) -> KVCacheLayout:
        """One latent [c_kv | k_pe] per token for every decoder layer and every MTP layer (atom_aot/ops/mla.py)."""
        return KVCacheLayout(cfg.num_hidden_layers + cfg.num_nextn_predict_layers, 1, 1, cfg.deepseek.latent_dim)

    def kv_scale_name(self, cache_layer: int) -> str:
        """Cache layers past the decoder's are the MTP layers' (kv_cache_layout)."""
        layers = self.config.num_hidden_layers
        if cache_layer < layers:
            return super().kv_scale_name(cache_layer)
        return f"mtp.{cache_layer - layers}.block.self_attn.kv_scale"

    def use_kernels(self, row: PhaseTuning) -> "DeepseekV3ForCausalLM":
        mla = make_backend("mla_attention", row.op("mla_attention"))
        for layer in [*self.model.layers, *(m.block for m in self.mtp)]:
            layer.self_attn.mla_backend = mla
        use_moe_kernels(self, row.op("moe"))
        self.attach_peer_table()
        return self

    def hidden_states(self, inputs: StepInputs) -> torch.Tensor:
        """The final-normed hidden states [T, hidden] of every token of the step (what the MTP layer reads)."""
        return self.model(inputs.input_ids, inputs.positions, inputs.attention_inputs())

    def mtp_logits(self, previous_hidden: torch.Tensor, inputs: StepInputs, depth: int = 0):
        """The MTP proposer's step; see atom_aot/models/deepseek_mtp.py `MTPLayer.forward` and docs/deepseek.md."""
        return self.mtp[depth](previous_hidden, inputs, self.model.rotary)

    def target_step(self) -> nn.Module:
        """With MTP layers the packages also return the hidden states (deepseek_mtp.LogitsAndHidden)."""
        return LogitsAndHidden(self) if len(self.mtp) else self

    def mtp_step(self) -> MTPStep | None:
        """The module the build exports as the `mtp` package (None: the model has no MTP layer)."""
        return MTPStep(self) if len(self.mtp) else None

    @classmethod
    def adapt_checkpoint(cls, cfg: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]]
                         ) -> Iterator[tuple[str, torch.Tensor]]:
        """HF DeepSeek names -> this module's, as they stream: kv_b_proj split into W_UK / W_UV, and layers
        >= num_hidden_layers moved under `mtp.{i}`. (Experts are stacked by weights/experts.py.)"""
        ds = cfg.deepseek
        for name, tensor in tensors:
            name = _mtp_name(name, cfg.num_hidden_layers)
            if name.endswith("self_attn.kv_b_proj.weight"):
                w_uk, w_uv = split_kv_b_proj(tensor, cfg.num_attention_heads, ds.qk_nope_head_dim)
                prefix = name.removesuffix("kv_b_proj.weight")
                yield prefix + "w_uk", w_uk
                yield prefix + "w_uv", w_uv
            else:
                yield name, tensor

    @classmethod
    def mtp_checkpoint_tensors(cls, cfg: ModelConfig, names: Collection[str]) -> dict[str, list[str]]:
        """MTP layer i is the checkpoint's layer num_hidden_layers + i: MTP_OWN_WEIGHTS and a decoder block
        named as the checkpoint's last decoder layer is (DeepSeek-V3's are both MoE layers; a block of
        another kind than that layer is left to the conversion's check of every parameter)."""
        last = cfg.num_hidden_layers - 1
        block = [n.removeprefix(f"model.layers.{last}.") for n in names if n.startswith(f"model.layers.{last}.")]
        wanted = {}
        for layer in range(cfg.num_hidden_layers, cfg.num_hidden_layers + cfg.num_nextn_predict_layers):
            own_block = block if cfg.is_moe_layer(layer) == cfg.is_moe_layer(last) else []
            wanted[f"model.layers.{layer}."] = [f"model.layers.{layer}.{n}" for n in (*MTP_OWN_WEIGHTS, *own_block)]
        return wanted


def _mtp_name(name: str, num_hidden_layers: int) -> str:
    """`model.layers.{L + i}.enorm.weight` -> `mtp.{i}.enorm.weight`; its decoder block's tensors go under
    `mtp.{i}.block.`; the decoder's own layers keep their names."""
    match = LAYER.match(name)
    if match is None or int(match.group(1)) < num_hidden_layers:
        return name
    depth, rest = int(match.group(1)) - num_hidden_layers, match.group(2)
    return f"mtp.{depth}.{rest}" if rest.startswith(MTP_OWN) else f"mtp.{depth}.block.{rest}"

