"""Signing an artifact that already exists: `atom-build --sign ART --sign-key KEY`, and a build with
`--sign-key` that finds its artifact in the cache (signing never changes the build key, so the
cached artifact is the one to sign, not a second copy).

The artifact is checked first (every member's sha256), since the signature vouches for what the
manifest lists. One already signed by the same key is left as it is; any other signature is
replaced. A folder gets its `manifest.sig` replaced by a rename; an archive is rewritten beside
itself with the new signature entry and renamed over the old file (one copy of its bytes: a tar
entry cannot be replaced in place), so a reader sees the old artifact or the new one, never half.
"""
from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from atom_aot.artifact.layout import MANIFEST_CHECKSUM, SIGNATURE
from atom_aot.artifact.reader import Artifact
from atom_aot.artifact.signing import SigningKey
from atom_aot.artifact.writer import add_bytes
from atom_aot.errors import ArtifactError

COPY_BUFFER_BYTES = 1 << 24


@dataclass(frozen=True)
class Signed:
    path: Path
    fingerprint: str          # of the key that signed it
    changed: bool             # False: it was signed by this key already


def sign_artifact(path: str | Path, key: SigningKey) -> Signed:
    """`path` signed by `key` (after checking every member against the manifest)."""
    path = Path(path)
    artifact = Artifact.open(path)
    if _signed_by(artifact, key):
        return Signed(path, key.fingerprint, changed=False)
    artifact.verify(full=True)
    signature = key.sign(artifact.manifest_bytes).to_bytes()
    del artifact                                  # its mapped files, before the rename over them
    if path.is_dir():
        _replace_file(path.resolve() / SIGNATURE, signature)
    else:
        _rewrite_archive(path, signature)
    return Signed(path, key.fingerprint, changed=True)


def _signed_by(artifact: Artifact, key: SigningKey) -> bool:
    try:
        signer = artifact.read_signer()
    except ArtifactError:                         # a damaged signature is replaced
        return False
    return signer is not None and signer.fingerprint == key.fingerprint


def _replace_file(dest: Path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=dest.parent, prefix=".partial-", delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, dest)


def _rewrite_archive(path: Path, signature: bytes) -> None:
    """The archive with its entries in order, any old signature dropped and the new one after the checksum."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    os.close(fd)
    try:
        with tarfile.open(path, "r:") as src, \
                tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT, copybufsize=COPY_BUFFER_BYTES) as dst:
            for entry in src:
                if entry.name == SIGNATURE:
                    continue
                dst.addfile(entry, src.extractfile(entry) if entry.isfile() else None)
                if entry.name == MANIFEST_CHECKSUM:
                    add_bytes(dst, SIGNATURE, signature)
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
