"""The content-addressed cache that members are unpacked into (compiled packages, tokenizer), since
the loaders that read them want files. Only verified bytes are written, a reused entry is checked
by hash again, and every destination is resolved and must stay inside the cache: nothing an
artifact says can make the runtime write anywhere else."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from atom_aot.artifact.digest import fast_hash
from atom_aot.errors import ArtifactError


def cache_root() -> Path:
    return Path(os.environ.get("ATOM_AOT_CACHE", Path.home() / ".cache" / "atom_aot"))


def unpack_root() -> Path:
    return cache_root() / "unpacked"


def inside_cache(dest: Path) -> Path:
    """`dest` resolved, after checking that it stays inside the unpack cache."""
    root = unpack_root()
    root.mkdir(parents=True, exist_ok=True)
    real_root, real = root.resolve(), dest.resolve()
    if real_root not in real.parents:
        raise ArtifactError(f"refusing to unpack to {dest}: it resolves to {real}, outside the unpack cache "
                            f"{real_root} (a symlink planted in the cache?). Remove {real_root} and retry.")
    return real


def _holds(path: Path, xxh3: str) -> bool:
    return path.is_file() and not path.is_symlink() and fast_hash(path.read_bytes()) == xxh3


def unpack_file(digest: str, filename: str, xxh3: str, read: Callable[[], bytes]) -> Path:
    """unpacked/<digest>/<filename> holding the bytes `read()` gives (checked against `xxh3` first)."""
    dest = inside_cache(unpack_root() / digest / filename)
    if _holds(dest, xxh3):
        return dest
    data = read()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=inside_cache(dest.parent), prefix=".partial-", delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, dest)
    return dest


def unpack_dir(digest: str, prefix: str, files: dict[str, str], read: Callable[[str], bytes]) -> Path:
    """unpacked/<digest>/<prefix>/ holding exactly `files` (file name -> xxh3), each from `read(name)`."""
    dest = inside_cache(unpack_root() / digest / prefix)
    if _dir_holds(dest, files):
        return dest
    if dest.exists():
        shutil.rmtree(dest)           # a stale or tampered copy: unpack it again
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=inside_cache(dest.parent), prefix=".partial-"))
    try:
        for name in files:
            inside_cache(staging / name).write_bytes(read(name))
        os.replace(staging, dest)
    except OSError:
        if not _dir_holds(dest, files):   # another process unpacking the same members got there first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def _dir_holds(dest: Path, files: dict[str, str]) -> bool:
    if not dest.is_dir() or dest.is_symlink() or {p.name for p in dest.iterdir()} != set(files):
        return False
    return all(_holds(dest / name, xxh3) for name, xxh3 in files.items())
