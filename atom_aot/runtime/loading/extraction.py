"""Where compiled packages are extracted while they are loaded: a folder of this process inside the
atom-aot cache, `<cache>/extract/<pid>-<start>/`, never the system's temporary folder.

torch's package loader unpacks each package (its wrapper `.so`, kernels) into a fresh
`aotinductor_*` folder under the temporary folder it reads from TMPDIR, and removes it when the
loader is destroyed. An engine killed (SIGKILL, out of memory) never destroys its loaders, so
that folder would stay in /tmp for good. Here TMPDIR points at this process's folder while a
loader is made; the folder is removed when the process exits cleanly, and the first load of a
later process removes the folders of processes that are gone (`<start>` is the process's start
time, so a pid the system has since given to another process does not keep a stale folder).
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from atom_aot.artifact.unpack import cache_root

log = logging.getLogger("atom_aot")

FOLDER_NAME = re.compile(r"(\d+)-(\d+)")
_env_lock = threading.Lock()          # TMPDIR is process-wide: one loader is made at a time
_folders: dict[int, Path] = {}         # pid -> its folder (a forked child makes its own)
_warned: list[bool] = []


def extraction_root() -> Path:
    return cache_root() / "extract"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks after boot (/proc/<pid>/stat field 22); None: no such process, or
    no /proc to read it from."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])     # fields after the command's name start at field 3


def folder_name(pid: int) -> str:
    return f"{pid}-{start_time(pid) or 0}"


def is_stale(name: str) -> bool:
    """Whether a folder named `<pid>-<start>` belongs to a process that is gone. A name of another form is not one
    of these folders, and is left alone."""
    match = FOLDER_NAME.fullmatch(name)
    if match is None:
        return False
    pid, start = int(match[1]), int(match[2])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass                           # alive, another user's
    started = start_time(pid)
    return started is not None and start != 0 and started != start     # the pid now belongs to another process


def remove_stale(root: Path | None = None) -> list[Path]:
    """Remove the extraction folders of processes that are gone; returns them."""
    root = root or extraction_root()
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and is_stale(p.name)]
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    if stale:
        log.info("removed %d extraction folder(s) of engines that are gone from %s", len(stale), root)
    return stale


def process_folder() -> Path:
    """This process's extraction folder, made (after removing stale ones) on first use and removed at exit."""
    pid = os.getpid()
    if pid not in _folders:
        remove_stale()
        folder = extraction_root() / folder_name(pid)
        folder.mkdir(parents=True, exist_ok=True)
        _folders[pid] = folder
        atexit.register(_remove, folder, pid)
    return _folders[pid]


def _remove(folder: Path, owner: int) -> None:
    if os.getpid() == owner:           # a forked child inherits the parent's exit handlers
        shutil.rmtree(folder, ignore_errors=True)


def remove_process_folder() -> None:
    """Remove this process's folder now: for a process that leaves with os._exit, which runs no exit handlers
    (a forked tensor-parallel rank)."""
    folder = _folders.pop(os.getpid(), None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def extracting_into(folder: Path) -> Iterator[None]:
    """TMPDIR set to `folder` while torch's package loader is made inside; logs once if this torch unpacked the
    package elsewhere (a torch that does not read TMPDIR)."""
    tempfile.gettempdir()              # Python's own temporary folder is fixed before TMPDIR changes
    with _env_lock:
        before = set(os.listdir(folder))
        previous = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(folder)
        try:
            yield
        finally:
            if previous is None:
                del os.environ["TMPDIR"]
            else:
                os.environ["TMPDIR"] = previous
        if set(os.listdir(folder)) == before and not _warned:
            _warned.append(True)
            import torch
            log.warning("torch %s extracted a compiled package outside %s (it does not take TMPDIR): a process "
                        "killed while serving leaves it in its temporary folder", torch.__version__, folder)
