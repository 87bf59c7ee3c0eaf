"""How many of its multi-token-prediction (MTP) layers an artifact holds: all that config.json declares, or none
where the checkpoint has none of their tensors. transformers' save_pretrained of a DeepseekV3ForCausalLM writes
such a checkpoint (its model has no MTP module) and keeps `num_nextn_predict_layers: 1` in config.json; vLLM
serves it without the MTP layer, and so do we. The manifest records the count (`model.mtp_layers`), from which
the runtime sizes the KV cache (no MTP cache layer) and refuses `--method mtp`; no `mtp` package is built.
A checkpoint with only some of the tensors is refused, naming those it lacks."""
from __future__ import annotations

import logging
from typing import Callable, Iterable

from atom_aot.errors import BuildError
from atom_aot.models import ModelConfig, model_class

log = logging.getLogger("atom_aot")
SHOWN_MISSING = 8     # missing tensor names a refusal lists


def checkpoint_mtp_layers(cfg: ModelConfig, tensor_names: Callable[[], Iterable[str]]) -> ModelConfig:
    """`cfg` as the artifact holds it, given the checkpoint's tensor names (read only when the config declares
    MTP layers)."""
    declared, model_cls = cfg.num_nextn_predict_layers, model_class(cfg.architecture)
    if not declared or not model_cls.BUILDS_MTP_LAYERS:      # a family that builds none skips them itself (GLM)
        return cfg
    names = set(tensor_names())
    wanted = model_cls.mtp_checkpoint_tensors(cfg, names)
    field = f"{model_cls.MTP_CONFIG_FIELD}={declared}"
    prefixes = ", ".join(f"{prefix}*" for prefix in wanted)
    if not any(name.startswith(tuple(wanted)) for name in names):
        log.info("build: config.json has %s, but the checkpoint has no MTP tensors (%s; transformers' save_pretrained "
                 "leaves them out): the artifact is built without MTP layers, so --method mtp is refused on it and "
                 "--method ngram / draft work", field, prefixes)
        return cfg.with_mtp_layers(0)
    missing = [name for layer in wanted.values() for name in layer if name not in names]
    if missing:
        more = f" and {len(missing) - SHOWN_MISSING} more" if len(missing) > SHOWN_MISSING else ""
        raise BuildError(f"config.json has {field} and the checkpoint holds some of those layers' tensors ({prefixes}) "
                         f"but not all: it lacks {', '.join(missing[:SHOWN_MISSING])}{more}. Build from a checkpoint "
                         f"with all of them (as DeepSeek ships it) or with none (as transformers' save_pretrained "
                         f"writes it: then the artifact is built without MTP layers)")
    return cfg


def held_mtp_layers(cfg: ModelConfig) -> int:
    """The MTP layers an artifact of `cfg` (as checkpoint_mtp_layers left it) holds: the manifest's model.mtp_layers."""
    return cfg.num_nextn_predict_layers if model_class(cfg.architecture).BUILDS_MTP_LAYERS else 0
