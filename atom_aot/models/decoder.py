"""The dense decoder-only transformer that Llama and Qwen3 share.

A family's file says how it differs (QK-norm, bias, weight names); this file holds the common
structure. The forward takes one `StepInputs` (atom_aot/artifact/signature.py), the signature
the build exports. Attention runs through the backend the tuning row names (atom_aot/ops/backends).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Iterable

import torch
from torch import nn

from atom_aot.artifact.kv_cache import KVCacheLayout
from atom_aot.artifact.tuning import BackendChoice, PhaseTuning
from atom_aot.models.config import ModelConfig
from atom_aot.models.layers import RMSNorm, RotaryEmbedding, make_linear
from atom_aot.models.parallel import (ONE_RANK, PEER_TABLE_BUFFER, PartialSums, Split, attach_peer_table,
                                      check_splittable, defer_reduction, local_kv_heads, make_embedding,
                                      reduce_partial_sums, vocab_logits)
from atom_aot.models.quant_layers import quantizes_silu_mul, use_linear_kernels
from atom_aot.models.step_inputs import StepInputs
from atom_aot.ops.backends import make_backend
from atom_aot.ops.backends.base import AttentionArgs, AttentionBackend, AttentionInputs, QKNorm
from atom_aot.ops.backends.silu_mul_quant import silu_mul


@dataclass(frozen=True)
class AttentionOptions:
    """What a family's attention adds to Llama's, from its model class (DecoderForCausalLM)."""
    qk_norm: bool = False                  # per-head RMSNorm of q and k before rope (Qwen3)
    sinks: bool = False                    # a learned logit per head in the softmax's denominator (GPT-OSS)
    windows: tuple[int | None, ...] = ()   # per layer: its sliding window (ops/attention.py), None: full
    o_proj_bias: bool = False              # o_proj has a bias (transformers ties it to attention_bias but in GLM)


class DecoderAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, quant: str, options: AttentionOptions,
                 tp: int = 1):
        """`cfg.attention_bias`: q, k and v have biases, o_proj one where `options.o_proj_bias`; over tp ranks
        o_proj's bias is whole on rank 0 and zero on the others, so the partial sums add it once (weights/shard.py)."""
        super().__init__()
        self.layer, self.tp = layer, tp
        # this rank's heads (models/parallel.py; the model checked that they split)
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads // tp, local_kv_heads(cfg, tp)
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        self.qkv_proj = make_linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, cfg.attention_bias, dtype, quant)
        self.o_proj = make_linear(self.q_size, cfg.hidden_size, options.o_proj_bias, dtype, quant)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, dtype) if options.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, dtype) if options.qk_norm else None
        # this rank's heads' sink logits, in float32 (a bf16 checkpoint's convert exactly)
        self.sinks = nn.Parameter(torch.empty(self.num_heads)) if options.sinks else None
        self.sliding_window = options.windows[layer] if options.windows else None
        # an fp8 KV cache's per-tensor (k, v) scales: the checkpoint's or calibrated at build (1.0 otherwise)
        self.register_buffer("kv_scale", torch.ones(2, dtype=torch.float32))
        # the reference backend until DecoderForCausalLM.use_kernels sets the phase's choice
        self.attention_backend: AttentionBackend = make_backend("attention", BackendChoice("reference"))
        self.defer_reduce = False      # True: the output stays partial sums for the next norm (parallel.py)

    def forward(self, positions, x, rotary: RotaryEmbedding, attn: AttentionInputs):
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.unflatten(-1, (self.num_heads, self.head_dim))      # [T, H, D]
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))   # [T, Hkv, D]
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        qk_norm = None if self.q_norm is None else QKNorm(self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        kv_scale = self.kv_scale if attn.kv_cache.element_size() == 1 else None   # only an fp8 cache is scaled
        o = self.attention_backend(AttentionArgs(self.layer, q, k, v, positions, rotary.cos_sin_cache, qk_norm,
                                                 self.scale, attn, kv_scale, self.sinks, self.sliding_window))  # [T, H, D]
        return reduce_partial_sums(self.o_proj(o.flatten(-2)), self.tp, self.defer_reduce)


class GatedMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: str, tp: int = 1,
                 intermediate_size: int | None = None):
        """`intermediate_size`: the block's own width where a family sets it (DeepSeek's dense and shared
        experts); this rank holds 1/tp of it."""
        super().__init__()
        self.tp = tp
        width = (intermediate_size or cfg.intermediate_size) // tp
        self.gate_up_proj = make_linear(cfg.hidden_size, 2 * width, False, dtype, quant)
        self.down_proj = make_linear(width, cfg.hidden_size, False, dtype, quant)
        self.defer_reduce = False      # True: the output stays partial sums for the next norm (parallel.py)

    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        if quantizes_silu_mul(self.down_proj):      # an fp8 one whose row names a silu_mul_quant backend
            out = self.down_proj.forward_silu_mul(gate_up)
        else:
            out = self.down_proj(silu_mul(gate_up))
        return reduce_partial_sums(out, self.tp, self.defer_reduce)


class DecoderLayer(nn.Module):
    # whether attention / the MLP hand their partial sums to the norm after them (DecoderModel.defer_reductions)
    attn_partial = mlp_partial = False

    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, quant: str, attention: AttentionOptions,
                 mlp: nn.Module, tp: int = 1):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = DecoderAttention(cfg, layer, dtype, quant, attention, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = mlp     # [T, hidden] -> [T, hidden]: GatedMLP, or a family's MoE block

    def forward(self, positions, hidden, residual, rotary, attn: AttentionInputs, partial: PartialSums | None = None,
                hidden_partial: bool = False):
        """`partial`: how this layer's norms all-reduce the partial sums handed to them: attention's where
        `attn_partial`, and `hidden` itself where `hidden_partial` (the layer before's MLP's)."""
        if partial is None and (self.attn_partial or hidden_partial):
            raise RuntimeError("a layer with partial sums to all-reduce was called without PartialSums")
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual, partial if hidden_partial else None)
        hidden = self.self_attn(positions, hidden, rotary, attn)
        hidden, residual = self.post_attention_layernorm(hidden, residual, partial if self.attn_partial else None)
        return self.mlp(hidden), residual

    def quantized_norms(self) -> list[tuple[RMSNorm, nn.Module]]:
        """(norm, the linear that alone takes its output): the norms use_linear_kernels may point at an
        rms_norm_quant backend, so that they hand that linear its input quantized (models/quant_layers.py)."""
        pairs = []
        if isinstance(self.self_attn, DecoderAttention):
            pairs.append((self.input_layernorm, self.self_attn.qkv_proj))
        if isinstance(self.mlp, GatedMLP):
            pairs.append((self.post_attention_layernorm, self.mlp.gate_up_proj))
        return pairs


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: str, attention: AttentionOptions,
                 max_positions: int, make_mlp: Callable[[int], nn.Module], tp: int = 1, rotary_dim: int | None = None):
        """`rotary_dim`: the dims of each head rope rotates (the family's `rotary_dim`; default all)."""
        super().__init__()
        self.embed_tokens = make_embedding(cfg.vocab_size, cfg.hidden_size, dtype, tp)
        self.rotary = RotaryEmbedding(rotary_dim or cfg.head_dim, max_positions)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype, quant, attention, make_mlp(i), tp)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.defer_reductions(tp)

    def defer_reductions(self, tp: int) -> None:
        """Over tp > 1 ranks, attention, dense MLPs and MoE blocks leave their all-reduce to the RMSNorm after
        them, which does it with the residual add in one kernel on GPUs (collectives.all_reduce_add_rms_norm)."""
        self.tp = tp
        for layer in self.layers:
            layer.attn_partial = tp > 1 and defer_reduction(layer.self_attn)
            layer.mlp_partial = tp > 1 and defer_reduction(layer.mlp)

    def forward(self, input_ids, positions, attn: AttentionInputs):
        partial = PartialSums(self.tp, getattr(self, PEER_TABLE_BUFFER, None)) if self.tp > 1 else None
        hidden, residual, hidden_partial = self.embed_tokens(input_ids), None, False   # [T, hidden]
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, self.rotary, attn, partial, hidden_partial)
            hidden_partial = layer.mlp_partial
        hidden, _ = self.norm(hidden, residual, partial if hidden_partial else None)
        return hidden


class DecoderForCausalLM(nn.Module):
    """Base of the causal-LM families. Subclasses set `qk_norm`, `attention_sinks` and `o_proj_bias`, may
    extend `PACKED_MODULES` and override `make_mlp` (the MoE families: atom_aot/models/moe.py) and `layer_window`."""

    qk_norm = False
    # the share of each head's dims rope rotates where config.json sets no partial_rotary_factor
    PARTIAL_ROTARY_FACTOR = 1.0
    BUILDS_MTP_LAYERS = False      # whether the checkpoint's MTP layers (num_nextn_predict_layers) are built
    attention_sinks = False
    ATTENTION_OPS = ("attention",)     # the backend-registry ops this family calls (tuning.json has a row for each)
    # checkpoint module name -> (runtime module name, index of its part in the fused parameter)
    PACKED_MODULES = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }
    # checkpoint expert projection -> (stacked parameter, part): models with experts (models/moe.py)
    EXPERT_MODULES: dict[str, tuple[str, int]] = {}
    # checkpoint module name -> runtime module name, where they differ
    MODULE_RENAMES: dict[str, str] = {}
    # the config.json field counting the family's multi-token-prediction layers (None: it has none)
    MTP_CONFIG_FIELD: str | None = None

    @property
    def o_proj_bias(self) -> bool:
        """Whether o_proj has a bias: `attention_bias` says so in Llama, Qwen3 and GPT-OSS (transformers' rule)."""
        return self.config.attention_bias

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, quant: str = "none", max_positions: int | None = None,
                 split: Split = ONE_RANK):
        """`split`: the module is one rank's part of the model cut that way (models/parallel.py)."""
        super().__init__()
        check_splittable(cfg, split)
        self.config, self.split = cfg, split
        attention = AttentionOptions(self.qk_norm, self.attention_sinks,
                                     tuple(self.layer_window(cfg, i) for i in range(cfg.num_hidden_layers)),
                                     self.o_proj_bias)
        self.model = DecoderModel(cfg, dtype, quant, attention, max_positions or cfg.max_position_embeddings,
                                  lambda layer: self.make_mlp(layer, dtype, quant), split.tp, self.rotary_dim(cfg))
        # lm_head stays unquantized: it decides the argmax. It splits over the vocabulary like the embedding.
        vocab_rows = self.model.embed_tokens.weight.shape[0]
        self.lm_head = (None if cfg.tie_word_embeddings
                        else make_linear(cfg.hidden_size, vocab_rows, False, dtype, "none"))

    @classmethod
    def rotary_dim(cls, cfg: ModelConfig) -> int:
        """The dims of each head rope rotates, the first ones (the cos/sin table's width, ops/rope.py): all of
        them unless `partial_rotary_factor` (transformers' int(head_dim * factor)) says fewer."""
        factor = cls.PARTIAL_ROTARY_FACTOR if cfg.partial_rotary_factor is None else cfg.partial_rotary_factor
        dim = int(cfg.head_dim * factor)
        if dim % 2 or not 0 < dim <= cfg.head_dim:
            raise ValueError(f"partial_rotary_factor {factor} rotates {dim} of the head's {cfg.head_dim} dims; "
                             f"rope needs an even number of them, at least 2")
        return dim

    def make_mlp(self, layer: int, dtype: torch.dtype, quant: str) -> nn.Module:
        """The feed-forward block of `layer` (a family with experts chooses per layer)."""
        return GatedMLP(self.config, dtype, quant, self.split.tp)

    @classmethod
    def layer_window(cls, cfg: ModelConfig, layer: int) -> int | None:
        """The sliding window of `layer` (None: full attention), by transformers' rule for this family: the config's
        `layer_types` where it has them, else every layer slides (Mixtral, Qwen3-MoE)."""
        if cfg.sliding_window is None:
            return None
        if cfg.layer_types is None:
            return cfg.sliding_window
        return cfg.sliding_window if cfg.layer_types[layer] == "sliding_attention" else None

    @classmethod
    def adapt_checkpoint(cls, cfg: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]]
                         ) -> Iterable[tuple[str, torch.Tensor]]:
        """Checkpoint tensors renamed/reshaped to this family's names before fusing (none for the dense ones)."""
        return tensors

    @classmethod
    def mtp_checkpoint_tensors(cls, cfg: ModelConfig, names: Collection[str]) -> dict[str, list[str]]:
        """Per MTP layer, its checkpoint name prefix -> the tensors a checkpoint of these tensor `names` holds
        for it (build/mtp_layers.py decides from them; the dense families have no MTP layers)."""
        return {}

    @classmethod
    def kv_cache_layout(cls, cfg: ModelConfig) -> KVCacheLayout:
        """Per-head keys and values for every layer (atom_aot/ops/attention.py)."""
        return KVCacheLayout(cfg.num_hidden_layers, 2, cfg.num_key_value_heads, cfg.head_dim)

    @staticmethod
    def kv_scale_name(cache_layer: int) -> str:
        """The `kv_scale` buffer of the attention writing cache layer `cache_layer` (an fp8 cache's scales)."""
        return f"model.layers.{cache_layer}.self_attn.kv_scale"

    def mtp_step(self) -> nn.Module | None:
        """The multi-token-prediction step module the build compiles as the `mtp` package (dense families: none)."""
        return None

    def use_kernels(self, row: PhaseTuning) -> "DecoderForCausalLM":
        """Run every op through the backend `row` (one phase of tuning.json) names; the build exports
        once per phase's row."""
        attention = make_backend("attention", row.op("attention"))
        for layer in self.model.layers:
            layer.self_attn.attention_backend = attention
        use_linear_kernels(self, row)
        self.attach_peer_table()
        return self

    def attach_peer_table(self) -> None:
        """Over tp > 1 ranks on GPUs, the peer table the norms' fused all-reduce reads (models/parallel.py)."""
        if self.split.tp > 1:
            attach_peer_table(self.model, self.model.embed_tokens.weight.device)

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """Runs T tokens of B sequences; returns float32 logits [N, vocab] for the rows in logits_indices."""
        return self.logits_and_hidden(inputs)[0]

    def logits_and_hidden(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 logits [N, vocab] as `forward`, and the final-normed hidden states [T, hidden] of every
        token of the step (what an MTP layer reads)."""
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.attention_inputs())   # [T, hidden]
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return vocab_logits(hidden[inputs.logits_indices], weight, self.config.vocab_size, self.split.tp), hidden

    def target_step(self) -> nn.Module:
        """The module the build exports as the mixed and decode packages: the model itself, or, for a
        model with MTP layers, `LogitsAndHidden` (the MTP proposer reads the hidden states)."""
        return self
