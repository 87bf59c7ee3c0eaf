"""The local artifact cache: artifacts named by model, target and build key."""
from __future__ import annotations

import os
import re
from pathlib import Path

from atom_aot.artifact.build_options import random_weights
from atom_aot.artifact.reader import Artifact
from atom_aot.build.config import BuildConfig
from atom_aot.errors import ArtifactError

KEY_DIGITS = 12


def default_cache_dir() -> Path:
    return Path(os.environ.get("ATOM_AOT_ARTIFACTS", "artifacts"))


def artifact_name(model_name: str, config: BuildConfig, key: str) -> str:
    model = re.sub(r"[^a-z0-9.]+", "-", model_name.lower()).strip("-")
    ranks = (f"tp{config.tensor_parallel_size}" + (f"-dp{config.data_parallel_size}" if config.data_parallel_size > 1
                                                    else "") + ("-ep" if config.enable_expert_parallel else ""))
    weights = f"-{config.load_format}" if random_weights(config.load_format) else ""   # random weights say so too
    return f"{model}{weights}-{config.arch}-{ranks}-{config.quant}-{key[:KEY_DIGITS]}.atom"


def find_cached(cache_dir: Path, key: str) -> Path | None:
    """The cached artifact with this key, if one is there (checked against its manifest's full key)."""
    for path in sorted(cache_dir.glob(f"*-{key[:KEY_DIGITS]}.atom")):
        try:
            if Artifact.open(path).manifest.build_key == key:
                return path
        except ArtifactError:
            continue          # a broken or older-format file is rebuilt, not trusted
    return None
