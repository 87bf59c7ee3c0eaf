"""The facts about a model that our module code reads, parsed from a Hugging Face config.json.

Only the fields the models use are kept, so the build key and the runtime depend on nothing
else. Both the transformers-4 (`rope_theta`, `rope_scaling`) and transformers-5
(`rope_parameters`) spellings are accepted.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from atom_aot.models.deepseek_config import DeepseekFields

SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear", "yarn")


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
    deepseek: DeepseekFields | None = None     # latent attention, MoE routing, MTP (DeepSeek-V2/V3 only)

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        rope_type = self.rope_scaling_dict.get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope scaling type {rope_type!r} is not supported; "
                             f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")

    @property
    def rope_scaling_dict(self) -> dict:
        return dict(self.rope_scaling or ())

    @classmethod
    def from_hf_dict(cls, d: dict) -> "ModelConfig":
        architectures = d.get("architectures") or [d.get("model_type", "?")]
        heads = d["num_attention_heads"]
        rope_params = dict(d.get("rope_parameters") or {})
        rope_theta = d.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        scaling = d.get("rope_scaling") or {
            k: v for k, v in rope_params.items() if k != "rope_theta"}
        if scaling and "type" in scaling and "rope_type" not in scaling:
            scaling = {**scaling, "rope_type": scaling["type"]}
        scaling = {k: v for k, v in scaling.items() if k != "type"}
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
            deepseek=DeepseekFields.from_hf_dict(d) if "kv_lora_rank" in d else None,
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelConfig":
        return cls.from_hf_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["rope_scaling"] = self.rope_scaling_dict or None
        return d
