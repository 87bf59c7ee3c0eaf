"""Opening and checking artifacts (a `.atom` archive, or the same tree as a folder).

Both forms are read the same way: the manifest must match its checksum, and, when the caller names
trusted keys, carry a signature by one of them over its exact bytes (signing.py), and parse as a
`Manifest` (every field, and the fixed member layout) before any member is touched; only members the
manifest lists are ever read, and each is checked against its hash before it is handed out (a
rank's weights, hashed beside their upload: before anything made from them is used).
Weights are viewed in place (mapped); every other member a loader wants as a file (compiled
packages, the tokenizer) is a checked copy unpacked into the content-addressed cache, never the
artifact's own file, so a file dropped into or altered in a folder artifact is never used.
"""
from __future__ import annotations

import json
import mmap
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import zstandard

from atom_aot.artifact.digest import fast_hash, sha256
from atom_aot.artifact.graph_plan import GRAPHS, GraphPlan
from atom_aot.artifact.layout import MANIFEST, MANIFEST_CHECKSUM, REBUILD, SIGNATURE, ZSTD_SUFFIX
from atom_aot.artifact.manifest import Manifest, Member
from atom_aot.artifact.tuning import TUNING, Tuning
from atom_aot.artifact.unpack import unpack_dir, unpack_file
from atom_aot.errors import ArtifactError

if TYPE_CHECKING:
    from atom_aot.artifact.signing import Signer, TrustedKeys


@dataclass(frozen=True)
class _Stored:
    file: Path           # the archive, or the member's own file in a folder
    offset: int          # of the member's bytes within `file`
    size: int            # stored size (compressed size for zstd members)
    compressed: bool


@dataclass(frozen=True)
class _Head:
    """What is read before any member: the manifest's bytes, its checksum and its signature (None: unsigned)."""
    manifest: bytes
    checksum: bytes
    signature: bytes | None


class Artifact:
    """An opened artifact: its typed manifest and checked access to the members it lists."""

    def __init__(self, path: Path, manifest: Manifest, stored: dict[str, _Stored], head: _Head,
                 signer: Signer | None):
        self.path = path
        self.manifest = manifest
        self.signer = signer                   # the trusted key that signed it (None: not asked for at open)
        self._head = head
        self._stored = stored
        self._maps: dict[Path, mmap.mmap | bytes] = {}
        self._verified: set[str] = set()       # members whose stored bytes matched their xxh3

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, trusted_keys: str | Path | TrustedKeys | None = None) -> "Artifact":
        """`trusted_keys` (a folder of public keys, or those keys): refuse the artifact, before its manifest is
        parsed, unless one of them signed it."""
        path = Path(path)
        trusted = _trusted(trusted_keys)
        if not path.exists():
            raise ArtifactError(f"no artifact at {path}")
        try:
            return cls._open_folder(path, trusted) if path.is_dir() else cls._open_archive(path, trusted)
        except ArtifactError:
            raise
        except (OSError, tarfile.TarError, ValueError, EOFError) as e:
            raise ArtifactError(f"{path} is not a readable atom-aot artifact ({type(e).__name__}: {e}). "
                                f"It may be truncated or corrupt: rebuild it with atom-build.") from None

    @classmethod
    def _open_folder(cls, path: Path, trusted: TrustedKeys | None) -> "Artifact":
        root = path.resolve()
        if not (root / MANIFEST).is_file() or not (root / MANIFEST_CHECKSUM).is_file():
            raise ArtifactError(f"{path} has no {MANIFEST} and {MANIFEST_CHECKSUM}: it is not an atom-aot artifact.")
        signed = (root / SIGNATURE).is_file()
        head = _Head((root / MANIFEST).read_bytes(), (root / MANIFEST_CHECKSUM).read_bytes(),
                     (root / SIGNATURE).read_bytes() if signed else None)
        manifest, signer = _parse_manifest(path, head, trusted)
        stored = {}
        for name, member in manifest.members.items():
            file = (root / name).resolve()
            if root not in file.parents or not file.is_file():
                raise ArtifactError(f"{path}: member {name} is missing (or not a plain file inside the folder). "
                                    f"{REBUILD}")
            if member.stored != "raw":
                raise ArtifactError(f"{path}: member {name} is marked {member.stored}, but a folder stores members "
                                    f"raw: the manifest is malformed. {REBUILD}")
            stored[name] = _Stored(file, 0, file.stat().st_size, False)
        return cls(path, manifest, stored, head, signer)

    @classmethod
    def _open_archive(cls, path: Path, trusted: TrustedKeys | None) -> "Artifact":
        size = path.stat().st_size
        with tarfile.open(path, "r:") as tar:
            entries = {m.name: m for m in tar.getmembers() if m.isfile()}
            if MANIFEST not in entries or MANIFEST_CHECKSUM not in entries:
                raise ArtifactError(f"{path} has no manifest: it is not an atom-aot artifact, or it is truncated.")
            head = _Head(tar.extractfile(entries[MANIFEST]).read(), tar.extractfile(entries[MANIFEST_CHECKSUM]).read(),
                         tar.extractfile(entries[SIGNATURE]).read() if SIGNATURE in entries else None)
        manifest, signer = _parse_manifest(path, head, trusted)
        stored = {}
        for name, member in manifest.members.items():
            compressed = member.stored == "zstd"
            entry = entries.get(name + ZSTD_SUFFIX if compressed else name)
            if entry is None or entry.offset_data + entry.size > size or entry.size != member.stored_size:
                raise ArtifactError(f"{path}: member {name} is missing or cut short (truncated file?). {REBUILD}")
            stored[name] = _Stored(path, entry.offset_data, entry.size, compressed)
        return cls(path, manifest, stored, head, signer)

    # -- origin -----------------------------------------------------------------------------
    @property
    def manifest_bytes(self) -> bytes:
        """The manifest exactly as stored: what a signature covers."""
        return self._head.manifest

    def read_signer(self) -> Signer | None:
        """Who signed it, checked against the key the signature names (None: unsigned), whether or not that key
        is trusted (`signer` says which trusted key signed it, when the artifact was opened with trusted keys)."""
        from atom_aot.artifact.signing import read_signer
        return read_signer(self._head.manifest, self._head.signature, str(self.path))

    # -- checking ---------------------------------------------------------------------------
    def verify(self, full: bool = False, only: list[str] | None = None, skip: frozenset[str] = frozenset(),
               threads: int = 1) -> None:
        """Check every member (or those in `only`) but `skip` against the manifest: xxh3-128 (fast, at every
        load; a member checked before is not hashed again) or sha256 (`verify`). `threads` > 1 hashes that
        many members at once (the hashes release the GIL: rank 0's check of every rank's weights file)."""
        names = [n for n in (self.manifest.members if only is None else only)
                 if n not in skip and (full or n not in self._verified)]
        if threads <= 1 or len(names) <= 1:
            for name in names:
                self._check(name, self._contents(name), full)
            return
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(min(threads, len(names)), thread_name_prefix="atom-verify") as pool:
            list(pool.map(lambda name: self._check(name, self._contents(name), full), names))

    def _check(self, name: str, data, full: bool = False) -> None:
        member = self.manifest.members[name]
        if len(data) != member.size:
            self._corrupt(name, f"size {len(data)} != {member.size}")
        if (sha256(data) != member.sha256) if full else (fast_hash(data) != member.xxh3):
            self._corrupt(name, "its hash does not match the manifest")
        self._verified.add(name)

    def _corrupt(self, name: str, why: str):
        raise ArtifactError(f"{self.path}: member {name} is corrupt ({why}). Nothing from this artifact was "
                            f"loaded. Rebuild it with atom-build, or copy it again.")

    # -- members ----------------------------------------------------------------------------
    def _member(self, name: str) -> Member:
        if name not in self.manifest.members:
            raise ArtifactError(f"{self.path}: the manifest lists no member {name}. {REBUILD}")
        return self.manifest.members[name]

    def _contents(self, name: str):
        """A member's bytes as stored, decompressed if need be (mapped, not copied, when raw)."""
        member, s = self._member(name), self._stored[name]
        data = memoryview(self._mapped(s.file))[s.offset:s.offset + s.size]
        if not s.compressed:
            return data
        try:
            return zstandard.ZstdDecompressor().decompress(data, max_output_size=member.size)
        except zstandard.ZstdError as e:
            self._corrupt(name, f"zstd: {e}")

    def _mapped(self, file: Path):
        if file not in self._maps:
            with open(file, "rb") as fh:
                empty = os.fstat(fh.fileno()).st_size == 0
                self._maps[file] = b"" if empty else mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._maps[file]

    def member_buffer(self, name: str) -> memoryview:
        """A listed member's bytes, checked against the manifest (mapped, not copied, when stored raw)."""
        data = self._contents(name)
        if name not in self._verified:
            self._check(name, data)
        return memoryview(data)

    def unchecked_member_buffer(self, name: str) -> memoryview:
        """A listed member's bytes before they are checked, for a loader that hashes them in another thread
        while it copies them (a rank's weights on their way to the GPU: the hash and the upload take about as
        long each) and hands out nothing made from them until that `verify(only=[name])` has returned."""
        return memoryview(self._contents(name))

    def member_bytes(self, name: str) -> bytes:
        """A private copy of a listed member, checked after copying (what is written or parsed is what was checked)."""
        data = bytes(self._contents(name))
        self._check(name, data)
        return data

    def member_path(self, name: str) -> Path:
        """A checked copy of one member in the unpack cache, keyed by its sha256."""
        member = self._member(name)
        return unpack_file(member.sha256[:32], Path(name).name, member.xxh3, lambda: self.member_bytes(name))

    def member_dir(self, prefix: str) -> Path:
        """A folder in the unpack cache holding exactly the listed members under `prefix/` (e.g. tokenizer/)."""
        names = sorted(n for n in self.manifest.members if n.startswith(prefix + "/"))
        files = {n.removeprefix(prefix + "/"): self.manifest.members[n].xxh3 for n in names}
        digest = fast_hash(json.dumps(files, sort_keys=True).encode())
        return unpack_dir(digest, prefix, files, lambda file: self.member_bytes(f"{prefix}/{file}"))

    # -- typed members ----------------------------------------------------------------------
    def read_json(self, name: str) -> dict:
        """A listed JSON member (config/config.json, config/generation_config.json) as a dict."""
        try:
            data = json.loads(self.member_bytes(name))
        except (ValueError, RecursionError) as e:
            raise ArtifactError(f"{self.path}: member {name} is not valid JSON ({e}). {REBUILD}") from None
        if not isinstance(data, dict):
            raise ArtifactError(f"{self.path}: member {name} must hold a JSON object. {REBUILD}")
        return data

    def read_tuning(self) -> Tuning:
        return Tuning.from_dict(self.read_json(TUNING))

    def read_graph_plan(self) -> GraphPlan:
        return GraphPlan.from_json(self.member_bytes(GRAPHS))


def _trusted(trusted_keys: str | Path | TrustedKeys | None) -> TrustedKeys | None:
    if trusted_keys is None or not isinstance(trusted_keys, (str, Path)):
        return trusted_keys
    from atom_aot.artifact.signing import TrustedKeys
    return TrustedKeys.load(trusted_keys)


def _parse_manifest(path: Path, head: _Head, trusted: TrustedKeys | None) -> tuple[Manifest, Signer | None]:
    """The manifest and, with trusted keys, its signer: checksum, then signature, then parsing."""
    if fast_hash(head.manifest) != head.checksum.decode("ascii", "replace").strip():
        raise ArtifactError(f"{path}: the manifest does not match its checksum (corrupt or edited). {REBUILD}")
    signer = trusted.check(head.manifest, head.signature, str(path)) if trusted is not None else None
    return Manifest.from_json(head.manifest, f"{path}: {MANIFEST}"), signer
