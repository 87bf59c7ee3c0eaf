"""Real model files the tests compare against, shipped in the repository under tests/data (tests/data/README.md
says where each comes from): the Qwen3 and Llama-3 tokenizers, SmolLM2-135M-Instruct's Hugging Face files.
JSON files over 8 KiB are stored zstd-compressed (`NAME.zst`) and unpacked here into a folder of the test
session, so a bare clone runs every test that reads them."""
from __future__ import annotations

import shutil
from pathlib import Path

import zstandard

DATA = Path(__file__).resolve().parent / "data"
FOLDERS = ("tokenizers/qwen3", "tokenizers/llama3", "smollm2-135m-instruct")


def unpack(folder: str, dest_root: Path) -> Path:
    """tests/data/<folder> as a model folder under `dest_root`: `*.zst` members decompressed, the rest copied."""
    source = DATA / folder
    if folder not in FOLDERS or not source.is_dir():
        raise FileNotFoundError(f"tests/data has no shipped folder {folder!r} (shipped: {', '.join(FOLDERS)})")
    dest = dest_root / folder
    dest.mkdir(parents=True, exist_ok=True)
    for member in sorted(source.iterdir()):
        if member.suffix == ".zst":
            with member.open("rb") as src, (dest / member.stem).open("wb") as out:
                zstandard.ZstdDecompressor().copy_stream(src, out)
        else:
            shutil.copyfile(member, dest / member.name)
    return dest
