from atom_aot.models.config import ModelConfig  # noqa: F401
from atom_aot.models.registry import MODEL_REGISTRY, model_class  # noqa: F401
