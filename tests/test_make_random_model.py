"""scripts/make_random_model.py writes random weights of a real architecture's shapes in shards (one in host
memory at a time) with transformers' index, which transformers and atom-build both read."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from factories import make_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_random_model import make_random_model, plan_shards  # noqa: E402

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128, hidden_size=32,
              intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def test_shards_keep_the_order_and_the_bound():
    assert plan_shards({"a": 4, "b": 4, "c": 9, "d": 1}, 8) == [["a", "b"], ["c"], ["d"]]


def test_a_sharded_folder_loads_in_transformers_and_in_atom_build(tmp_path):
    from transformers import AutoModelForCausalLM

    from atom_aot.build.source import resolve_model
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    make_tokenizer(tmp_path / "tokenizer")
    out = make_random_model(config, tmp_path / "model", tmp_path / "tokenizer", dtype="float32", shard_bytes=40_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == files
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert set(index["weight_map"]) == set(model.state_dict())
    source = resolve_model(str(out))
    assert sorted(p.name for p in source.weight_files) == files
    loaded = dict(source.tensors())
    assert all(torch.equal(loaded[name], tensor) for name, tensor in model.state_dict().items())


def test_hub_expert_names_load_to_the_same_model(tmp_path):
    """--hub-expert-names writes a MoE's stacked experts one tensor per expert (what vLLM loads): transformers
    reads it back to the same model as the stacked folder, and so does atom-build's source."""
    from transformers import AutoModelForCausalLM

    from atom_aot.build.source import resolve_model
    from test_dummy_weights import CONFIG as TINY_MOE
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TINY_MOE))
    make_tokenizer(tmp_path / "tokenizer")
    stacked = make_random_model(config, tmp_path / "stacked", tmp_path / "tokenizer", dtype="float32")
    hub = make_random_model(config, tmp_path / "hub", tmp_path / "tokenizer", dtype="float32", shard_bytes=40_000,
                            hub_expert_names=True)
    names = set(json.loads((hub / "model.safetensors.index.json").read_text())["weight_map"])
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in names and not any("gate_up_proj" in n for n in names)
    want = AutoModelForCausalLM.from_pretrained(stacked, dtype=torch.float32).state_dict()
    got = AutoModelForCausalLM.from_pretrained(hub, dtype=torch.float32).state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert len(dict(resolve_model(str(hub)).tensors())) == len(names)


def test_fp8_blocks_write_deepseeks_fp8_checkpoint_format(tmp_path, build_artifact):
    """--fp8-blocks (with --hub-expert-names): every linear weight e4m3 with a `weight_scale_inv` per 128x128 block
    that dequantizes to the draw, the embeddings, head and routers as drawn, config.json's quantization_config as
    DeepSeek ships it; atom-build takes it as a block-scaled FP8 checkpoint, and it decodes."""
    from safetensors.torch import load_file

    from atom_aot import LLMEngine, SamplingParams
    from atom_aot.artifact.reader import Artifact
    from deepseek_factories import BLOCK_DEEPSEEK, TINY_DEEPSEEK
    fields = {**TINY_DEEPSEEK, **BLOCK_DEEPSEEK, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
              "vocab_size": 256, "num_nextn_predict_layers": 0, "bos_token_id": 1, "eos_token_id": 2}
    config = tmp_path / "config.json"
    config.write_text(json.dumps(fields))
    make_tokenizer(tmp_path / "tokenizer")
    drawn = make_random_model(config, tmp_path / "bf16", tmp_path / "tokenizer", dtype="float32", hub_expert_names=True)
    fp8 = make_random_model(config, tmp_path / "fp8", tmp_path / "tokenizer", dtype="float32", hub_expert_names=True,
                            fp8_blocks=True)
    assert json.loads((fp8 / "config.json").read_text())["quantization_config"]["weight_block_size"] == [128, 128]
    want, got = load_file(str(drawn / "model.safetensors")), load_file(str(fp8 / "model.safetensors"))
    expert = "model.layers.1.mlp.experts.3.down_proj.weight"
    for name in (expert, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.0.self_attn.o_proj.weight"):
        q, scale = got[name], got[name.replace(".weight", ".weight_scale_inv")]
        assert q.dtype == torch.float8_e4m3fn and scale.shape == (-(-q.shape[0] // 128), q.shape[1] // 128)
        dequantized = q.float() * scale.repeat_interleave(128, 0)[:q.shape[0]].repeat_interleave(128, 1)
        assert torch.allclose(dequantized, want[name], rtol=0.07, atol=1e-6)      # e4m3: 3 mantissa bits
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.gate.weight"):
        assert got[name].dtype == torch.float32 and torch.equal(got[name], want[name])
    artifact = build_artifact(fp8, compile="none")
    quantization = Artifact.open(artifact).manifest.quantization
    assert quantization.weights == "fp8-block" and quantization.weights_origin != "none", quantization
    out = LLMEngine(str(artifact)).generate([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0]["token_ids"]) == 4
