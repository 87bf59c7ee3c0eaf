"""The facts about a model that our module code reads, parsed from a Hugging Face config.json.

Only the fields the models use are kept, so the build key and the runtime depend on nothing
else. Both the transformers-4 (`rope_theta`, `rope_scaling`) and transformers-5
(`rope_parameters`) spellings are accepted.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from atom_aot.models.deepseek_config import DeepseekFields
from atom_aot.models.grouped_moe_config import GroupedMoEFields

SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear", "yarn")
SUPPORTED_ACTIVATIONS = ("silu", "swish")      # transformers' two names of x * sigmoid(x), what GatedMLP computes
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    rope_scaling: tuple[tuple[str, float | str], ...] | None = None  # frozen form of a dict
    partial_rotary_factor: float | None = None   # rope on this share of each head's dims; None: the family's default
    use_qk_norm: bool = False              # per-head RMSNorm of q and k where a family makes it optional (GLM-4-MoE)
    sliding_window: int | None = None      # attention window, if the config enables one (which layers: the family's
    layer_types: tuple[str, ...] | None = None    # rule, DecoderForCausalLM.layer_window), per layer "sliding_attention"
    max_window_layers: int | None = None          # or "full_attention"; Qwen3: layers from this one on slide
    # GPT-OSS's clamped SwiGLU experts (ops/moe.py ExpertActivation); None elsewhere
    swiglu_alpha: float | None = None
    swiglu_limit: float | None = None
    # mixture of experts (0 experts: a dense model); router aux-loss fields are training-only, ignored
    num_experts: int = 0                   # HF `num_experts`, `num_local_experts` or `n_routed_experts` (DeepSeek)
    num_experts_per_tok: int = 0           # top-k
    moe_intermediate_size: int = 0         # I of each expert (Mixtral: its intermediate_size)
    norm_topk_prob: bool = False           # renormalize the top-k weights to sum to 1
    decoder_sparse_step: int = 1           # every n-th layer has experts ...
    mlp_only_layers: tuple[int, ...] = ()  # ... except these, which are dense
    grouped_moe: GroupedMoEFields | None = None   # sigmoid grouped routing + shared experts (DeepSeek-V3, GLM-4.5)
    deepseek: DeepseekFields | None = None     # latent attention (DeepSeek-V2/V3, Kimi-K2)
    num_nextn_predict_layers: int = 0      # MTP layers stored after the decoder's (whether built: the family's)

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        rope_type = self.rope_scaling_dict.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope scaling type {rope_type!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        if self.layer_types is not None and (len(self.layer_types) != self.num_hidden_layers
                                             or not set(self.layer_types) <= set(LAYER_TYPES)):
            raise ValueError(f"layer_types must name one of {', '.join(LAYER_TYPES)} for each of the "
                             f"{self.num_hidden_layers} layers, got {list(self.layer_types)}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 (or null), got {self.sliding_window}")
        if self.num_experts and not (1 <= self.num_experts_per_tok <= self.num_experts
                                     and self.moe_intermediate_size > 0 and self.decoder_sparse_step >= 1):
            raise ValueError(f"a mixture of experts needs 1 <= num_experts_per_tok ({self.num_experts_per_tok}) "
                             f"<= num_experts ({self.num_experts}), moe_intermediate_size > 0 "
                             f"({self.moe_intermediate_size}) and decoder_sparse_step >= 1 "
                             f"({self.decoder_sparse_step})")

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer` has experts (Hugging Face's rule for Qwen3-MoE; every layer for Mixtral)."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    def with_mtp_layers(self, count: int) -> "ModelConfig":
        """The same model holding `count` of its MTP layers: an artifact built from a checkpoint without their
        tensors holds none (build/mtp_layers.py; its manifest's `model.mtp_layers` says so)."""
        if count == self.num_nextn_predict_layers:
            return self
        if not 0 <= count < self.num_nextn_predict_layers:
            raise ValueError(f"{count} MTP layers asked of a model whose config declares {self.num_nextn_predict_layers}")
        return replace(self, num_nextn_predict_layers=count)

    @property
    def rope_scaling_dict(self) -> dict:
        return dict(self.rope_scaling or ())

    @classmethod
    def from_hf_dict(cls, d: dict) -> "ModelConfig":
        architectures = d.get("architectures") or [d.get("model_type", "?")]
        heads = d["num_attention_heads"]
        activation = d.get("hidden_act", "silu")
        if activation not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"hidden_act={activation!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED_ACTIVATIONS)}")
        rope_params = dict(d.get("rope_parameters") or {})
        rope_theta = d.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = dict(d.get("rope_scaling") or rope_params)
        # transformers' order: the rope dict's value, then the top-level field (config.json of transformers 4)
        partial = scaling.get("partial_rotary_factor", d.get("partial_rotary_factor"))
        if scaling and "type" in scaling and "rope_type" not in scaling:
            scaling = {**scaling, "rope_type": scaling["type"]}
        scaling = {k: v for k, v in scaling.items() if k not in ("type", "rope_theta", "partial_rotary_factor")}
        if scaling.get("rope_type", "default") == "default":
            scaling = {}
        return cls(
            architecture=architectures[0],
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            rope_scaling=tuple(sorted(scaling.items())) or None,
            partial_rotary_factor=None if partial is None else float(partial),
            use_qk_norm=bool(d.get("use_qk_norm", False)),
            sliding_window=d.get("sliding_window") if d.get("use_sliding_window", True) else None,
            layer_types=tuple(d["layer_types"]) if d.get("layer_types") else None,
            max_window_layers=d.get("max_window_layers"),
            swiglu_alpha=d.get("swiglu_alpha"),
            swiglu_limit=d.get("swiglu_limit"),
            **_moe_fields(d),
            grouped_moe=GroupedMoEFields.from_hf_dict(d) if d.get("n_routed_experts") else None,
            deepseek=DeepseekFields.from_hf_dict(d) if "kv_lora_rank" in d else None,
            # transformers 5 also reads the name num_mtp_layers
            num_nextn_predict_layers=d.get("num_nextn_predict_layers", d.get("num_mtp_layers")) or 0,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        return cls.from_hf_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rope_scaling"] = self.rope_scaling_dict or None
        return d


def _moe_fields(d: dict) -> dict:
    """The mixture-of-experts fields of an HF config in its spellings (none for a dense model); DeepSeek's
    `first_k_dense_replace` dense layers are its mlp_only_layers."""
    num_experts = d.get("num_experts") or d.get("num_local_experts") or d.get("n_routed_experts") or 0
    if not num_experts:
        return {}
    dense_first = tuple(range(d.get("first_k_dense_replace") or 0))
    return dict(num_experts=num_experts, num_experts_per_tok=d.get("num_experts_per_tok", 0),
                moe_intermediate_size=d.get("moe_intermediate_size") or d["intermediate_size"],
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                decoder_sparse_step=d.get("decoder_sparse_step") or 1,
                mlp_only_layers=tuple(d.get("mlp_only_layers") or ()) or dense_first)
