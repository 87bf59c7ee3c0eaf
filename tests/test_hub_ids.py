"""`--model ORG/NAME[@REVISION]`: resolved through huggingface_hub's cache to a snapshot folder; the
build key hashes the content, so an id and the same folder by path give one key."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from huggingface_hub import constants

from atom_aot.build.config import BuildConfig
from atom_aot.build.hub import HubId, parse_hub_id
from atom_aot.build.pipeline import plan

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def _populate(cache: Path, repo: str, model_dir: Path, commit: str, ref: str = "main") -> None:
    """An HF cache entry as huggingface_hub lays it out: refs/<ref> names a snapshot folder."""
    entry = cache / ("models--" + repo.replace("/", "--"))
    (entry / "refs").mkdir(parents=True, exist_ok=True)
    (entry / "refs" / ref).write_text(commit)
    shutil.copytree(model_dir, entry / "snapshots" / commit, dirs_exist_ok=True)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch, tiny_llama_dir) -> Path:
    cache = tmp_path / "hub"
    _populate(cache, "tiny-org/Tiny-Llama", tiny_llama_dir, COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_parse_hub_id(tmp_path, monkeypatch):
    assert parse_hub_id("Qwen/Qwen3-0.6B") == HubId("Qwen/Qwen3-0.6B", None)
    assert parse_hub_id("deepseek-ai/DeepSeek-R1@v1.0") == HubId("deepseek-ai/DeepSeek-R1", "v1.0")
    assert parse_hub_id("Qwen/Qwen3-0.6B").name == "Qwen3-0.6B"
    for not_an_id in ("./model", "/abs/model", "model.gguf", "a/b/c", "org/"):
        assert parse_hub_id(not_an_id) is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "local").mkdir(parents=True)
    assert parse_hub_id("org/local") is None          # an existing folder is a path, not an id


def test_hub_id_resolves_from_the_cache_to_the_same_key(hf_cache, tiny_llama_dir):
    config = BuildConfig(arch="cpu", compile="none")
    source, _, key, _ = plan("tiny-org/Tiny-Llama", config)
    assert source.path == hf_cache / "models--tiny-org--Tiny-Llama" / "snapshots" / COMMIT
    assert source.name == "Tiny-Llama"
    _, _, key_by_path, _ = plan(str(tiny_llama_dir), config)
    assert key == key_by_path


def test_revision_picks_its_snapshot(hf_cache, tiny_llama_dir, tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(tiny_llama_dir, changed)
    config_file = changed / "generation_config.json"
    config_file.write_text('{"temperature": 0.5}')
    _populate(hf_cache, "tiny-org/Tiny-Llama", changed, OTHER_COMMIT, ref="v2")
    config = BuildConfig(arch="cpu", compile="none")
    source, _, key_v2, _ = plan("tiny-org/Tiny-Llama@v2", config)
    assert source.path.name == OTHER_COMMIT
    assert plan("tiny-org/Tiny-Llama", config)[2] != key_v2


def test_dummy_build_reads_only_config_and_tokenizer(hf_cache):
    source, _, _, _ = plan("tiny-org/Tiny-Llama", BuildConfig(arch="cpu", compile="none", load_format="dummy"))
    assert source.name == "Tiny-Llama" and source.weight_files == []


def test_absent_id_names_the_id_and_the_cache(hf_cache):
    with pytest.raises(FileNotFoundError) as e:
        plan("nobody/Missing-Model@v3", BuildConfig(arch="cpu", compile="none"))
    message = str(e.value)
    assert "nobody/Missing-Model" in message and "'v3'" in message
    assert str(hf_cache) in message and "HF_HUB_OFFLINE" in message
