"""Write a staged artifact tree as a `.atom` archive or a folder, with its manifest.

Members are hashed (sha256 for `verify`, xxh3-128 for the check at every load) and, in the
archive, zstd-compressed when that saves at least a fifth (weights rarely compress; tokenizers
and compiled code do). The manifest is the first member, its own checksum the second, and its
signature (signing.py), when the build signs, the third. The
finished manifest is read back with `Manifest.from_json` before anything is written, so the build
never writes an artifact the reader would refuse.
"""
from __future__ import annotations

import dataclasses
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import zstandard

from atom_aot.artifact.digest import fast_hash, hash_file
from atom_aot.artifact.layout import MANIFEST, MANIFEST_CHECKSUM, SIGNATURE, ZSTD_SUFFIX
from atom_aot.artifact.manifest import Manifest, Member

if TYPE_CHECKING:
    from atom_aot.artifact.signing import SigningKey

COMPRESS_IF_RATIO_BELOW = 0.8
NEVER_COMPRESS = ("weights/",)


def _member_files(staging: Path) -> list[Path]:
    return sorted(p for p in staging.rglob("*") if p.is_file())


def describe_members(staging: Path, archive: bool) -> tuple[dict[str, Member], dict[str, bytes]]:
    """Manifest entries for every staged file, and the compressed bytes of those worth compressing."""
    members, compressed = {}, {}
    compressor = zstandard.ZstdCompressor(level=9, write_checksum=True)
    for f in _member_files(staging):
        name = f.relative_to(staging).as_posix()
        sha, xxh, size = hash_file(f)
        member = Member(size=size, sha256=sha, xxh3=xxh, stored="raw", stored_size=size)
        if archive and not name.startswith(NEVER_COMPRESS) and size > 4096:
            packed = compressor.compress(f.read_bytes())
            if len(packed) < COMPRESS_IF_RATIO_BELOW * size:
                compressed[name] = packed
                member = dataclasses.replace(member, stored="zstd", stored_size=len(packed))
        members[name] = member
    return members, compressed


def write_artifact(staging: Path, manifest: Manifest, out: Path, signing_key: SigningKey | None = None) -> Manifest:
    """`manifest` completed with the member table of `staging`, written to `out` (`.atom` file, else a
    folder) atomically, signed with `signing_key` if one is given; returns the manifest written. A folder
    takes staging's files by moving them (staging is left empty), so a 57 GiB model needs its bytes on disk
    once, not twice; an archive copies."""
    archive = out.suffix == ".atom"
    members, compressed = describe_members(staging, archive)
    manifest = dataclasses.replace(manifest, members=members)
    raw = manifest.to_json()
    Manifest.from_json(raw, f"the manifest of {out}")          # the reader's checks, before writing
    signature = signing_key.sign(raw).to_bytes() if signing_key is not None else None
    out.parent.mkdir(parents=True, exist_ok=True)
    if archive:
        _write_archive(staging, raw, signature, compressed, out)
    else:
        _write_folder(staging, raw, signature, out)
    return manifest


def _write_archive(staging: Path, manifest_raw: bytes, signature: bytes | None, compressed: dict[str, bytes],
                   out: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".partial")
    os.close(fd)
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            add_bytes(tar, MANIFEST, manifest_raw)
            add_bytes(tar, MANIFEST_CHECKSUM, fast_hash(manifest_raw).encode())
            if signature is not None:
                add_bytes(tar, SIGNATURE, signature)
            for f in _member_files(staging):
                name = f.relative_to(staging).as_posix()
                if name in compressed:
                    add_bytes(tar, name + ZSTD_SUFFIX, compressed[name])
                else:
                    tar.add(f, arcname=name, recursive=False)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _write_folder(staging: Path, manifest_raw: bytes, signature: bytes | None, out: Path) -> None:
    tmp = Path(tempfile.mkdtemp(dir=out.parent, suffix=".partial"))
    try:
        shutil.copytree(staging, tmp, dirs_exist_ok=True, copy_function=shutil.move)   # renames on one filesystem
        (tmp / MANIFEST).write_bytes(manifest_raw)
        (tmp / MANIFEST_CHECKSUM).write_text(fast_hash(manifest_raw))
        if signature is not None:
            (tmp / SIGNATURE).write_bytes(signature)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
