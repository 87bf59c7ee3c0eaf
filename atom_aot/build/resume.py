"""Finished build stages kept across runs of one build, so that a build stopped part-way resumes.

A large model's build is minutes of tuning and of AOTInductor compiles; a build killed after some of
them (a lent machine's time limit, a crash in a later stage, Ctrl-C) should not pay for them again.
Each finished stage is kept under <cache_dir>/partial/<build key>/: tuning.json (the measured kernel
choices) and each phase's compiled package. The build key hashes the weights, configs, tokenizer,
toolchain and engine code, so a kept package is what this build would compile again. Tuning is
measured, so it is reused only on the device it was measured on (its name is kept beside it).
Weights are converted again on every run: they are the cheap stage, and the compile needs them in memory.
A build that finishes removes its directory; `atom-build --force` removes it before starting.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from atom_aot.artifact.phase import Phase
from atom_aot.artifact.tuning import Tuning
from atom_aot.errors import ArtifactError

log = logging.getLogger("atom_aot")

PARTIAL_DIR = "partial"
TUNING_FILE = "tuning.json"
DEVICE_FILE = "tuning-device.txt"


def build_device_name(arch: str) -> str:
    """The device the build measures on: tuning kept on one is not reused on another."""
    if arch == "cpu":
        from atom_aot.arch import cpu_isa
        return f"cpu ({cpu_isa()})"
    import torch
    return torch.cuda.get_device_name()


@dataclass(frozen=True)
class StageCheckpoints:
    root: Path          # <cache_dir>/partial/<build key>
    device: str         # where this run measures (build_device_name)

    @classmethod
    def for_build(cls, cache_dir: Path, key: str, device: str) -> "StageCheckpoints":
        return cls(Path(cache_dir) / PARTIAL_DIR / key, device)

    def tuning(self) -> Tuning | None:
        """The kept tuning, when it was measured on this device and reads back whole."""
        path, device = self.root / TUNING_FILE, self.root / DEVICE_FILE
        if not (path.is_file() and device.is_file()):
            return None
        if device.read_text() != self.device:
            log.info("build: kept tuning was measured on %s, not %s: tuning again", device.read_text(), self.device)
            return None
        try:
            tuning = Tuning.from_dict(json.loads(path.read_bytes()))
        except (ArtifactError, ValueError) as e:
            log.warning("build: kept tuning %s unreadable (%s): tuning again", path, e)
            return None
        log.info("build: resumed tuning from %s", path)
        return tuning

    def keep_tuning(self, tuning: Tuning) -> None:
        self._write(DEVICE_FILE, self.device.encode())
        self._write(TUNING_FILE, tuning.to_json().encode())

    def package(self, phase: Phase) -> Path | None:
        """The kept compiled package of `phase`, if that compile finished in an earlier run."""
        path = self.root / f"{phase.value}.pt2"
        if path.is_file():
            log.info("build: resumed the %s package from %s", phase.value, path)
            return path
        return None

    def keep_package(self, phase: Phase, built: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".{phase.value}.pt2.part"
        shutil.copyfile(built, partial)
        os.replace(partial, self.root / f"{phase.value}.pt2")     # whole or absent, never half a package

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _write(self, name: str, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".{name}.part"
        partial.write_bytes(data)
        os.replace(partial, self.root / name)
