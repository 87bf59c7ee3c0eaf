"""Model classes keyed by the Hugging Face `architectures` name: the one place a new family registers."""
from __future__ import annotations

from atom_aot.artifact.kv_cache import KVCacheLayout
from atom_aot.errors import UnsupportedArchitectureError
from atom_aot.models.config import ModelConfig
from atom_aot.models.decoder import DecoderForCausalLM
from atom_aot.models.deepseek_v3 import DeepseekV3ForCausalLM
from atom_aot.models.glm4_moe import Glm4MoeForCausalLM
from atom_aot.models.gpt_oss import GptOssForCausalLM
from atom_aot.models.llama import LlamaForCausalLM
from atom_aot.models.mixtral import MixtralForCausalLM
from atom_aot.models.qwen3 import Qwen3ForCausalLM
from atom_aot.models.qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[DecoderForCausalLM]] = {
    "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,       # Kimi-K2 too (model_type kimi_k2)
    "Glm4MoeForCausalLM": Glm4MoeForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
}


def model_class(architecture: str) -> type[DecoderForCausalLM]:
    try:
        return MODEL_REGISTRY[architecture]
    except KeyError:
        raise UnsupportedArchitectureError(
            f"architecture {architecture!r} is not supported; supported: {', '.join(sorted(MODEL_REGISTRY))}"
        ) from None


def kv_cache_layout(cfg: ModelConfig) -> KVCacheLayout:
    """The KV cache's shape for `cfg`'s sizes (one rank's, given a rank's config), as its model class decides it."""
    return model_class(cfg.architecture).kv_cache_layout(cfg)
