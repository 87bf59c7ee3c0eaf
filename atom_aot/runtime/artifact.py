"""Opening and checking artifacts (a `.atom` archive, or the same tree as a folder).

Nothing is deserialized before the manifest and every member's hash check out. Weights are
mapped in place; the other members (compiled code, tokenizer, config) are unpacked once into a
content-addressed cache, since the loaders that read them want files.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

import xxhash
import zstandard

from atom_aot.errors import ArtifactError
from atom_aot.version import ARTIFACT_FORMAT_VERSION

MANIFEST = "manifest.json"
MANIFEST_CHECKSUM = "manifest.xxh3"
ZSTD_SUFFIX = ".zst"


def cache_root() -> Path:
    return Path(os.environ.get("ATOM_AOT_CACHE", Path.home() / ".cache" / "atom_aot"))


def fast_hash(data) -> str:
    return xxhash.xxh3_128_hexdigest(data)


@dataclass
class _Stored:
    offset: int        # of the member's bytes within the mapped file
    size: int          # stored size (compressed size for zstd members)
    compressed: bool


class Artifact:
    """An opened artifact: its manifest and access to its members."""

    def __init__(self, path: Path, manifest: dict, mapped: mmap.mmap | None, stored: dict[str, _Stored]):
        self.path = path
        self.manifest = manifest
        self._mapped = mapped
        self._stored = stored

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> "Artifact":
        path = Path(path)
        if not path.exists():
            raise ArtifactError(f"no artifact at {path}")
        try:
            if path.is_dir():
                return cls._open_folder(path)
            return cls._open_archive(path)
        except ArtifactError:
            raise
        except (OSError, tarfile.TarError, ValueError, KeyError) as e:
            raise ArtifactError(f"{path} is not a readable atom-aot artifact ({type(e).__name__}: {e}). "
                                f"It may be truncated or corrupt: rebuild it with atom-build.") from None

    @classmethod
    def _open_folder(cls, path: Path) -> "Artifact":
        manifest = _parse_manifest(path, (path / MANIFEST).read_bytes(), (path / MANIFEST_CHECKSUM).read_text())
        stored = {}
        for name in manifest["members"]:
            f = path / name
            if not f.is_file():
                raise ArtifactError(f"{path}: member {name} is missing. Rebuild the artifact with atom-build.")
            stored[name] = _Stored(0, f.stat().st_size, False)
        return cls(path, manifest, None, stored)

    @classmethod
    def _open_archive(cls, path: Path) -> "Artifact":
        with tarfile.open(path, "r:") as tar:
            entries = {m.name: m for m in tar.getmembers() if m.isfile()}
            if MANIFEST not in entries or MANIFEST_CHECKSUM not in entries:
                raise ArtifactError(f"{path} has no manifest: it is not an atom-aot artifact, or it is truncated.")
            manifest = _parse_manifest(path, tar.extractfile(entries[MANIFEST]).read(),
                                       tar.extractfile(entries[MANIFEST_CHECKSUM]).read().decode())
        with open(path, "rb") as fh:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        stored = {}
        for name, info in manifest["members"].items():
            compressed = info["stored"] == "zstd"
            entry = entries.get(name + ZSTD_SUFFIX if compressed else name)
            if entry is None or entry.offset_data + entry.size > len(mapped):
                raise ArtifactError(f"{path}: member {name} is missing or cut short (truncated file?). "
                                    f"Rebuild the artifact with atom-build.")
            stored[name] = _Stored(entry.offset_data, entry.size, compressed)
        return cls(path, manifest, mapped, stored)

    # -- checking ---------------------------------------------------------------------------
    def verify(self, full: bool = False) -> None:
        """Check every member against the manifest: xxh3-128 (fast, at every load) or sha256 (`verify`)."""
        for name, info in self.manifest["members"].items():
            data = self._raw_bytes(name)
            if info["stored"] == "zstd":
                data = self._decompress(name, data)
            if len(data) != info["size"]:
                self._corrupt(name, f"size {len(data)} != {info['size']}")
            ok = hashlib.sha256(data).hexdigest() == info["sha256"] if full else fast_hash(data) == info["xxh3"]
            if not ok:
                self._corrupt(name, "its hash does not match the manifest")

    def _corrupt(self, name: str, why: str):
        raise ArtifactError(f"{self.path}: member {name} is corrupt ({why}). Nothing from this artifact was "
                            f"loaded. Rebuild it with atom-build, or copy it again.")

    # -- members ----------------------------------------------------------------------------
    def members(self) -> list[str]:
        return list(self.manifest["members"])

    def _raw_bytes(self, name: str):
        s = self._stored[name]
        if self._mapped is None:
            with open(self.path / name, "rb") as fh:
                return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY) if s.size else b""
        return memoryview(self._mapped)[s.offset:s.offset + s.size]

    def _decompress(self, name: str, data) -> bytes:
        try:
            return zstandard.ZstdDecompressor().decompress(data, max_output_size=self.manifest["members"][name]["size"])
        except zstandard.ZstdError as e:
            self._corrupt(name, f"zstd: {e}")

    def member_buffer(self, name: str) -> memoryview:
        """A member's bytes, mapped (not copied) when stored raw."""
        data = self._raw_bytes(name)
        if self._stored[name].compressed:
            data = self._decompress(name, data)
        return memoryview(data)

    def verified_member(self, name: str) -> memoryview:
        """A member's bytes after checking them against the manifest (for readers that skip `verify`)."""
        data = self.member_buffer(name)
        if fast_hash(data) != self.manifest["members"][name]["xxh3"]:
            self._corrupt(name, "its hash does not match the manifest")
        return data

    def member_path(self, name: str) -> Path:
        """A file holding the member (the folder's own, or an unpacked copy keyed by its hash)."""
        if self._mapped is None:
            return self.path / name
        sha = self.manifest["members"][name]["sha256"]
        dest = cache_root() / "unpacked" / sha[:32] / Path(name).name
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as tmp:
                tmp.write(self.verified_member(name))
            os.replace(tmp.name, dest)
        elif fast_hash(dest.read_bytes()) != self.manifest["members"][name]["xxh3"]:
            dest.unlink()
            return self.member_path(name)
        return dest

    def member_dir(self, prefix: str) -> Path:
        """A folder with every member under `prefix/` (tokenizer/, config/)."""
        names = [n for n in self.members() if n.startswith(prefix + "/")]
        if self._mapped is None:
            return self.path / prefix
        digest = fast_hash("".join(self.manifest["members"][n]["xxh3"] for n in names).encode())
        dest = cache_root() / "unpacked" / digest / prefix
        if not dest.exists():
            cache_root().mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=cache_root()))
            for n in names:
                (staging / Path(n).relative_to(prefix)).parent.mkdir(parents=True, exist_ok=True)
                (staging / Path(n).relative_to(prefix)).write_bytes(self.verified_member(n))
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(staging, dest)
            except OSError:       # another process unpacked it first
                shutil.rmtree(staging, ignore_errors=True)
        return dest

    def read_json(self, name: str) -> dict:
        return json.loads(bytes(self.member_buffer(name)))


def _parse_manifest(path: Path, raw: bytes, checksum: str) -> dict:
    if fast_hash(raw) != checksum.strip():
        raise ArtifactError(f"{path}: the manifest does not match its checksum (corrupt or edited). "
                            f"Nothing was loaded. Rebuild the artifact with atom-build.")
    manifest = json.loads(raw)
    found = manifest.get("format_version")
    if found != ARTIFACT_FORMAT_VERSION:
        raise ArtifactError(
            f"{path} uses artifact format {found}, but this atom-aot ({_engine_version()}) reads format "
            f"{ARTIFACT_FORMAT_VERSION}. Rebuild it with this version's atom-build: "
            f"{rebuild_command(manifest)}")
    return manifest


def _engine_version() -> str:
    from atom_aot.version import __version__
    return __version__


def rebuild_command(manifest: dict, arch: str | None = None) -> str:
    """The atom-build command that makes an artifact like this one for `arch` (default: the same)."""
    build = manifest.get("build", {})
    model = manifest.get("model", {}).get("source")
    parts = ["atom-build"]
    if model:
        parts += ["--model", model]
    parts += ["--arch", arch or build.get("arch", "auto")]
    if build.get("tensor_parallel_size", 1) != 1:
        parts += ["-tp", str(build["tensor_parallel_size"])]
    if build.get("quant", "none") != "none":
        parts += ["--quant", build["quant"]]
    if build.get("max_model_len"):
        parts += ["--max-model-len", str(build["max_model_len"])]
    if build.get("block_size", 16) != 16:
        parts += ["--block-size", str(build["block_size"])]
    if build.get("compile") == "none":
        parts += ["--compile", "none"]
    return " ".join(parts)
