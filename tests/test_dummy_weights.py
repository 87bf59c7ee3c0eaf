"""`atom-build --load-format dummy`: random weights drawn at build from the config's shapes, the same
tensors scripts/make_random_model.py writes to a folder, recorded as random in the manifest."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from factories import make_config_folder, make_tokenizer
from safetensors.torch import load

from atom_aot.artifact.reader import Artifact
from atom_aot.build.config import BuildConfig
from atom_aot.build.pipeline import build, plan
from atom_aot.build.source import resolve_model
from atom_aot.runtime.inspect import describe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_random_model import make_random_model  # noqa: E402

CONFIG = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=384, hidden_size=32,
              intermediate_size=64, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0,
              eos_token_id=2, torch_dtype="float32")


@pytest.fixture(scope="module")
def config_only(tmp_path_factory) -> Path:
    """A folder with config.json and a tokenizer, no weights."""
    return make_config_folder(tmp_path_factory.mktemp("dummy") / "qwen3-moe-config", CONFIG)


def test_dummy_tensors_are_make_random_model_s(config_only, tmp_path):
    written = make_random_model(config_only / "config.json", tmp_path / "random", config_only, dtype="float32",
                                device="cpu", shard_bytes=20_000)
    on_disk = dict(resolve_model(str(written)).tensors())
    drawn = dict(resolve_model(str(config_only), "dummy").tensors())
    assert drawn.keys() == on_disk.keys() and len(drawn) > 10
    assert all(torch.equal(drawn[name], on_disk[name]) for name in drawn)
    assert any(t.dim() == 3 for t in drawn.values()) or any(".experts." in n for n in drawn)   # experts are there


def test_the_key_follows_the_config_not_files(config_only, tmp_path):
    _, _, key, inputs = plan(str(config_only), BuildConfig(arch="cpu", load_format="dummy"))
    assert plan(str(config_only), BuildConfig(arch="cpu", load_format="dummy"))[2] == key
    other = tmp_path / "other"
    shutil.copytree(config_only, other)
    (other / "config.json").write_text(json.dumps({**CONFIG, "num_hidden_layers": 3}))
    assert plan(str(other), BuildConfig(arch="cpu", load_format="dummy"))[3]["weights"] != inputs["weights"]


def test_a_dummy_build_serves_and_says_its_weights_are_random(config_only, tmp_path):
    from atom_aot import LLMEngine, SamplingParams
    result = build(str(config_only), BuildConfig(arch="cpu", compile="none", load_format="dummy"),
                   cache_dir=tmp_path, show_progress=False)
    assert "-dummy-" in result.path.name
    art = Artifact.open(result.path)
    assert art.manifest.options.load_format == "dummy"
    assert "RANDOM weights (--load-format dummy)" in describe(art)
    assert "--load-format dummy" in art.manifest.rebuild_command()
    written = make_random_model(config_only / "config.json", tmp_path / "random", config_only, dtype="float32",
                                device="cpu")
    from_files = build(str(written), BuildConfig(arch="cpu", compile="none"), cache_dir=tmp_path,
                       show_progress=False)
    dummy_weights, file_weights = (load(Artifact.open(p).member_bytes(art.manifest.layout.weights_member(0)))
                                   for p in (result.path, from_files.path))
    assert dummy_weights.keys() == file_weights.keys()
    assert all(torch.equal(dummy_weights[k], file_weights[k]) for k in dummy_weights)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    outs = [[o["token_ids"] for o in LLMEngine(path).generate(prompts, params)]
            for path in (result.path, from_files.path)]
    assert outs[0] == outs[1] and all(len(t) == 8 for t in outs[0])


def test_dummy_needs_a_config_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="--load-format dummy needs --model to be a folder with config.json"):
        resolve_model(str(tmp_path), "dummy")
    with pytest.raises(FileNotFoundError, match="--load-format dummy needs"):
        resolve_model(None, "dummy")
    with pytest.raises(ValueError, match="--load-format must be one of auto, dummy"):
        BuildConfig(arch="cpu", load_format="zeros")


def test_a_deepseek_config_gets_its_mtp_layer_and_serves_mtp(tmp_path):
    """transformers' DeepSeek-V3 leaves the MTP layer out; dummy weights add it as checkpoints name it
    (layer num_hidden_layers: the last layer's tensors plus enorm, hnorm, eh_proj, embed_tokens,
    shared_head), so a config-only DeepSeek builds with its `mtp` package and serves --method mtp."""
    from atom_aot import LLMEngine, SamplingParams
    from atom_aot.weights.random_draw import parameter_shapes
    from deepseek_factories import TINY_DEEPSEEK
    folder = tmp_path / "deepseek-config"
    folder.mkdir()
    tokenizer = make_tokenizer(folder)
    config = {**TINY_DEEPSEEK, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
              "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id, "eos_token_id": 2,
              "torch_dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config))
    shapes = parameter_shapes(folder)
    mtp, last, hidden = "model.layers.4.", "model.layers.3.", TINY_DEEPSEEK["hidden_size"]
    assert shapes[mtp + "eh_proj.weight"] == (hidden, 2 * hidden)
    assert shapes[mtp + "shared_head.head.weight"] == (len(tokenizer), hidden)
    block = {n.removeprefix(last) for n in shapes if n.startswith(last)}
    assert block and block <= {n.removeprefix(mtp) for n in shapes if n.startswith(mtp)}
    result = build(str(folder), BuildConfig(arch="cpu", compile="none", load_format="dummy"), cache_dir=tmp_path,
                   show_progress=False)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9], [9, 10, 11]]
    plain = [o["token_ids"] for o in LLMEngine(result.path).generate(prompts, params)]
    spec = LLMEngine(result.path, method="mtp", num_speculative_tokens=2)
    assert [o["token_ids"] for o in spec.generate(prompts, params)] == plain
    assert spec.print_mtp_statistics()["proposed_total"] > 0


def test_a_large_tensor_is_drawn_in_pieces_of_rows(monkeypatch):
    """A tensor over DRAW_PIECE_ELEMENTS is drawn a few rows at a time: every row is drawn (none left empty,
    no two pieces the same numbers), with the std asked for; norm weights near 1."""
    from atom_aot.weights import random_draw as dummy
    monkeypatch.setattr(dummy, "DRAW_PIECE_ELEMENTS", 300)          # 4 rows of 75 per piece: 2 pieces
    t = dummy.draw("w.weight", torch.Size([7, 25, 3]), torch.float32, torch.Generator().manual_seed(3), 0.02)
    assert t.abs().min() > 0 and not torch.equal(t[:3], t[4:7]) and 0.015 < t.std() < 0.025
    norm = dummy.draw("a.norm.weight", torch.Size([9, 40]), torch.bfloat16, torch.Generator().manual_seed(3), 0.02)
    assert norm.dtype == torch.bfloat16 and (norm.float() - 1).abs().max() < 1 and norm.float().std() > 0.05
