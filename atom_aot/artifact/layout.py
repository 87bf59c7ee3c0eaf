"""Where things sit inside an artifact: a fixed tree, so no name read from a manifest can point
anywhere else. Every member name is checked here before it is joined to a folder or a cache path.

    manifest.json, manifest.xxh3       the manifest and its checksum (not members)
    manifest.sig                       an ed25519 signature of manifest.json, if signed (not a member)
    weights/rank{r}.safetensors        one per rank of the layout
    compiled/{phase}.pt2               one per compiled phase
    tokenizer/{file}                   flat: tokenizer.json, tokenizer_config.json, ...
    config/config.json, config/generation_config.json, tuning.json, graphs.json
"""
from __future__ import annotations

import re
from typing import Iterable

from atom_aot.artifact.graph_plan import GRAPHS
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.tuning import TUNING
from atom_aot.errors import ArtifactError

MANIFEST = "manifest.json"
MANIFEST_CHECKSUM = "manifest.xxh3"
SIGNATURE = "manifest.sig"            # signing.py
ZSTD_SUFFIX = ".zst"                  # an archive entry holding a member zstd-compressed
CONFIG = "config/config.json"
GENERATION_CONFIG = "config/generation_config.json"
TOKENIZER = "tokenizer"
FIXED_MEMBERS = (TUNING, GRAPHS, CONFIG, GENERATION_CONFIG)
SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
BAD_SEGMENTS = {"": "has an empty segment", ".": "has a '.' segment",
                "..": "has a '..' segment (it would leave the tree)"}
REBUILD = "Nothing from this artifact was loaded. Rebuild it with atom-build."


def weights_member(rank: int) -> str:
    return f"weights/rank{rank}.safetensors"


def package_member(phase: Phase) -> str:
    return f"compiled/{phase.value}.pt2"


def is_tokenizer_file(name: str) -> bool:
    return name.startswith(TOKENIZER + "/") and name.count("/") == 1


def check_name(name: object, where: str) -> str:
    """`name` if it is a plain relative POSIX path (no `..`, `.`, empty segment, absolute path or backslash)."""
    why = _name_problem(name)
    if why:
        raise ArtifactError(f"{where} names member {name!r:.80}, which {why}. Member names must be plain relative "
                            f"paths inside the artifact, so this manifest is malformed or forged. {REBUILD}")
    return name


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "is not a non-empty string"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/"):
        return "is an absolute path"
    for segment in name.split("/"):
        if segment in BAD_SEGMENTS:
            return BAD_SEGMENTS[segment]
        if not SEGMENT.fullmatch(segment):
            return f"has the segment {segment!r:.40}, with characters outside A-Z a-z 0-9 . _ + -"
    return None


def check_members(names: Iterable[str], weights: Iterable[str], packages: Iterable[str], where: str) -> None:
    """Every member sits in the fixed tree, and every member the runtime needs is listed."""
    names = list(names)
    required = set(FIXED_MEMBERS) | set(weights) | set(packages)
    for name in names:
        check_name(name, where)
        if name not in required and not is_tokenizer_file(name):
            raise ArtifactError(f"{where} lists {name!r:.80}, which has no place in an artifact of this layout "
                                f"(weights/rank<r>.safetensors per rank, compiled/<phase>.pt2 per compiled "
                                f"phase, tokenizer/<file>, config/, tuning.json, graphs.json). {REBUILD}")
    missing = sorted(required - set(names))
    if not any(is_tokenizer_file(n) for n in names):
        missing.append(TOKENIZER + "/*")
    if missing:
        raise ArtifactError(f"{where} does not list the member(s) {', '.join(missing)}, which every artifact of "
                            f"this layout needs: it is incomplete. {REBUILD}")
