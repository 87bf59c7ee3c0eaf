"""Helpers for tests that take artifacts apart: forge a manifest (re-checksummed, so only the
reader's own checks can object), rewrite an archive's entries, flip bytes, and unpack an archive
into the folder form without rebuilding it."""
from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Callable

import zstandard

from atom_aot.artifact.digest import fast_hash
from atom_aot.artifact.layout import MANIFEST, MANIFEST_CHECKSUM, ZSTD_SUFFIX


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def entry_offsets(archive: Path) -> dict[str, tuple[int, int]]:
    """name -> (offset of its data, size) of every entry of a `.atom` file."""
    with tarfile.open(archive) as tar:
        return {m.name: (m.offset_data, m.size) for m in tar.getmembers()}


def read_entries(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def write_entries(archive: Path, entries: dict[str, bytes]) -> Path:
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def forged_manifest(raw: bytes, edit: Callable[[dict], None]) -> tuple[bytes, bytes]:
    manifest = json.loads(raw)
    edit(manifest)
    raw = json.dumps(manifest).encode()
    return raw, fast_hash(raw).encode()


def forge_archive(src: Path, out: Path, edit: Callable[[dict], None] = lambda m: None,
                  change: Callable[[dict[str, bytes]], None] = lambda e: None) -> Path:
    """A copy of `src` with its manifest edited by `edit` and its entries by `change`."""
    entries = read_entries(src)
    entries[MANIFEST], entries[MANIFEST_CHECKSUM] = forged_manifest(entries[MANIFEST], edit)
    change(entries)
    return write_entries(out, entries)


def forge_folder(src: Path, out: Path, edit: Callable[[dict], None] = lambda m: None) -> Path:
    """A copy of the folder artifact `src` with its manifest edited by `edit`."""
    folder = Path(shutil.copytree(src, out))
    raw, checksum = forged_manifest((folder / MANIFEST).read_bytes(), edit)
    (folder / MANIFEST).write_bytes(raw)
    (folder / MANIFEST_CHECKSUM).write_bytes(checksum)
    return folder


def folder_from_archive(archive: Path, out: Path) -> Path:
    """The folder form of a `.atom` file: every member stored raw, the manifest's table to match."""
    entries = read_entries(archive)
    manifest = json.loads(entries.pop(MANIFEST))
    entries.pop(MANIFEST_CHECKSUM)
    for name, data in entries.items():
        member = name.removesuffix(ZSTD_SUFFIX)
        if name.endswith(ZSTD_SUFFIX):
            data = zstandard.ZstdDecompressor().decompress(data)
            manifest["members"][member].update(stored="raw", stored_size=len(data))
        (out / member).parent.mkdir(parents=True, exist_ok=True)
        (out / member).write_bytes(data)
    raw = json.dumps(manifest).encode()
    (out / MANIFEST).write_bytes(raw)
    (out / MANIFEST_CHECKSUM).write_bytes(fast_hash(raw).encode())
    return out


def files_under(root: Path, skip: Path) -> dict[str, bytes]:
    """Every file below `root` but those in `skip`, with its bytes: to show nothing else was written."""
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and skip not in p.parents}


PREFILL_PROMPTS = (tuple(range(5, 60)), tuple(range(100, 140)))


def prefill_logits(artifact, prompts=PREFILL_PROMPTS):
    """Logits [T, V] at every position of the prompts' prefill (one step) through the artifact's (eager) model."""
    import torch
    from atom_aot.artifact.phase import Phase
    from atom_aot.weights.kv_scales import prefill_inputs
    from atom_aot.runtime.loading.loader import load_artifact
    loaded = load_artifact(artifact)
    model = loaded.forwards[Phase.MIXED]
    inputs = prefill_inputs(loaded.model_config, [list(p) for p in prompts], torch.float32, "cpu",
                            logits="all", layout=model.kv_cache_layout(loaded.model_config))
    with torch.no_grad():
        return model(inputs)
