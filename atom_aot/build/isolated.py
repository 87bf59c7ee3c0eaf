"""Build in a child process, for callers that serve afterwards (LLMEngine given a model folder).

A process that compiled (Inductor, Triton JIT) is not where compiled code should be loaded: on
some toolchains the two clash, and serving must not carry compilers anyway. The child is
`atom-build` itself, so its progress bars show as usual.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from atom_aot.build.cache import find_cached
from atom_aot.build.config import BuildConfig
from atom_aot.config_flags import to_argv
from atom_aot.errors import BuildError


def cli_args(model: str | None, config: BuildConfig, cache_dir: Path) -> list[str]:
    """atom-build's arguments for this build (the arch always explicit: the tool's default is auto)."""
    model_args = ["--model", str(model)] if model is not None else []
    return model_args + ["--arch", config.arch, *to_argv(config, skip=("arch",)), "--cache-dir", str(cache_dir)]


def build_cached(model: str | None, config: BuildConfig, cache_dir: Path) -> dict:
    """`build_isolated` for the build key of `model` under `config` (refused at once for an absent arch)."""
    from atom_aot.build.pipeline import check_arch_present, plan
    check_arch_present(config.arch)
    _, _, key, _ = plan(model, config)
    return build_isolated(model, config, cache_dir, key)


def build_isolated(model: str | None, config: BuildConfig, cache_dir: Path, key: str) -> dict:
    """The cached artifact for `key`, or one built by a child `atom-build`: {"path", "key", "cached", "seconds"}."""
    cached = find_cached(cache_dir, key)
    if cached is not None:
        return {"path": cached, "key": key, "cached": True, "seconds": {}}
    cmd = [sys.executable, "-m", "atom_aot.build.cli", *cli_args(model, config, cache_dir), "--summary-json"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise BuildError(f"atom-build failed (exit {proc.returncode}); its message is above. Command: "
                         + " ".join(cmd[2:]))
    result = json.loads(lines[-1])
    result["path"] = Path(result["path"])
    return result
