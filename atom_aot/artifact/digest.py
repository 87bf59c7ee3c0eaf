"""The two hashes of every member: xxh3-128 (about 10 GB/s, checked at every load) and sha256
(checked by `atom-run ART verify`)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import xxhash


def fast_hash(data) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()


def hash_file(path: Path) -> tuple[str, str, int]:
    """(sha256, xxh3-128, size) of a file, read in chunks."""
    sha, xxh, size = hashlib.sha256(), xxhash.xxh3_128(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            sha.update(chunk)
            xxh.update(chunk)
            size += len(chunk)
    return sha.hexdigest(), xxh.hexdigest(), size
