"""Present a GGUF file (llama.cpp's format) as a Hugging Face checkpoint.

The build step only knows HF checkpoints: a config dict, tensors named like
`model.layers.0.self_attn.q_proj.weight`, and a tokenizer folder. This module
turns a GGUF into exactly that, dequantizing each tensor to float32 as it is
read, so the rest of the build never sees GGUF names, layouts or quant types.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize


@dataclass(frozen=True)
class _Arch:
    """What differs between the GGUF architectures we read."""

    hf_class: str
    model_type: str
    # llama.cpp's converter permutes q/k rows for models it runs with
    # interleaved (GPT-J style) rope; NeoX-rope models such as Qwen3 are stored as-is.
    permuted_qk: bool
    extra_config: dict = field(default_factory=dict)


_ARCHS = {
    "llama": _Arch("LlamaForCausalLM", "llama", permuted_qk=True,
                   extra_config={"mlp_bias": False, "pretraining_tp": 1}),
    "qwen3": _Arch("Qwen3ForCausalLM", "qwen3", permuted_qk=False,
                   extra_config={"use_sliding_window": False, "sliding_window": None}),
}

# GGUF `blk.N.<key>` -> HF `model.layers.N.<value>`
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# GGUF general.file_type -> the dtype a dequantized model is meant to run in.
_FILE_TYPE_DTYPE = {0: "float32", 32: "bfloat16"}  # F16 and every quantized type: float16


@dataclass
class GGUFCheckpoint:
    """A GGUF file seen as an HF checkpoint; tensors are read lazily from the mmap."""

    config: dict  # config.json-compatible
    generation_config: dict  # generation_config.json-compatible
    path: str
    _reader: GGUFReader = field(repr=False)
    _arch: _Arch = field(repr=False)

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (HF name, float32 tensor) one at a time so a large model never sits in memory twice."""
        for t in self._reader.tensors:
            name = _hf_name(t.name)
            shape = tuple(reversed(t.shape.tolist()))  # GGUF lists ne0 (innermost) first
            w = torch.from_numpy(np.require(dequantize(t.data, t.tensor_type), np.float32, ["C", "W"]))
            w = w.reshape(shape)
            if self._arch.permuted_qk and name.split(".")[-2] in ("q_proj", "k_proj"):
                n_head = self.config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
                w = _unpermute_rope_rows(w, n_head)
            yield name, w

    def save_tokenizer(self, out_dir: str) -> None:
        """Write tokenizer.json, tokenizer_config.json (with chat_template) and special_tokens_map.json."""
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(os.path.dirname(self.path) or ".", gguf_file=os.path.basename(self.path))
        # The GGUF's ids are the truth: transformers 5.17's conversion makes eos
        # <|im_start|> and drops pad for SmolLM2 (5.23 gets them right).
        special = {role: tok.convert_ids_to_tokens(i) for role, i in self._special_ids().items()}
        for role, token in special.items():
            setattr(tok, role, token)
        tok.save_pretrained(out_dir)
        cfg_path = os.path.join(out_dir, "tokenizer_config.json")
        with open(cfg_path, encoding="utf-8") as f:
            tok_cfg = json.load(f)
        tok_cfg.update(special)
        for role, i in self._special_ids().items():
            if f"{role}_id" in tok_cfg:
                tok_cfg[f"{role}_id"] = i
        # transformers 5 moves the template to chat_template.jinja; readers of
        # tokenizer_config.json alone (older transformers, our runtime) still need it inline.
        template = tok.chat_template or _scalar(self._reader, "tokenizer.chat_template")
        if template is not None:
            tok_cfg["chat_template"] = template
        tok_cfg["model_max_length"] = self.config["max_position_embeddings"]
        tok_cfg["clean_up_tokenization_spaces"] = False  # byte-level BPE decodes exactly; 5.17 defaults to True
        _write_json(cfg_path, tok_cfg)
        _write_json(os.path.join(out_dir, "special_tokens_map.json"), special)

    def _special_ids(self) -> dict[str, int]:
        """{"bos_token": 1, ...} from the GGUF metadata, for the roles it sets."""
        eos = self.generation_config.get("eos_token_id")
        ids = {
            "bos_token": self.generation_config.get("bos_token_id"),
            "eos_token": eos[0] if isinstance(eos, list) else eos,
            "unk_token": _scalar(self._reader, "tokenizer.ggml.unknown_token_id"),
            "pad_token": self.generation_config.get("pad_token_id"),
        }
        return {role: i for role, i in ids.items() if i is not None}


def read_gguf(path: str) -> GGUFCheckpoint:
    """Open `path` (memory-mapped) and derive its HF config; no tensor is read yet."""
    reader = GGUFReader(path)
    arch_name = _scalar(reader, "general.architecture")
    if arch_name not in _ARCHS:
        raise ValueError(f"unsupported GGUF architecture {arch_name!r} in {path}; supported: {', '.join(_ARCHS)}")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(f"{path} carries a rope_freqs tensor (Llama 3.1-style rope scaling), which is not supported")
    arch = _ARCHS[arch_name]
    config = _config(reader, arch_name, arch, names)
    return GGUFCheckpoint(config, _generation_config(reader), path, reader, arch)


def _config(reader: GGUFReader, prefix: str, arch: _Arch, names: set[str]) -> dict:
    """The config.json an HF release of this model would have, from GGUF metadata and tensor shapes."""
    def meta(key: str, default: Any = None) -> Any:
        return _scalar(reader, f"{prefix}.{key}", default)

    hidden, n_head = meta("embedding_length"), meta("attention.head_count")
    shapes = {t.name: t.shape.tolist() for t in reader.tensors}  # GGUF order: [in, out]
    special = _generation_config(reader)
    config = {
        "architectures": [arch.hf_class],
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "intermediate_size": meta("feed_forward_length"),
        "num_hidden_layers": meta("block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": meta("attention.head_count_kv", n_head),
        "head_dim": shapes["blk.0.attn_q.weight"][1] // n_head,  # Qwen3's is not hidden // heads
        "hidden_act": "silu",
        "max_position_embeddings": meta("context_length"),
        "rms_norm_eps": meta("attention.layer_norm_rms_epsilon"),
        "rope_theta": meta("rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(meta),
        "attention_bias": "blk.0.attn_q.bias" in names,
        "attention_dropout": 0.0,
        "vocab_size": shapes["token_embd.weight"][1],  # metadata may omit it; the embedding cannot
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": _FILE_TYPE_DTYPE.get(_scalar(reader, "general.file_type"), "float16"),
        "use_cache": True,
        **arch.extra_config,
    }
    for key in ("bos_token_id", "pad_token_id"):
        config[key] = special.get(key)
    eos = special.get("eos_token_id")
    config["eos_token_id"] = eos[0] if isinstance(eos, list) else eos
    return config


def _rope_scaling(meta) -> dict | None:
    """HF rope_scaling from GGUF's rope.scaling.* keys; None when the model uses plain rope."""
    kind = meta("rope.scaling.type")
    factor = meta("rope.scaling.factor")
    if kind is None and meta("rope.scale_linear") is not None:
        kind, factor = "linear", meta("rope.scale_linear")
    if kind in (None, "none"):
        return None
    scaling = {"rope_type": kind, "factor": factor}
    if meta("rope.scaling.original_context_length") is not None:
        scaling["original_max_position_embeddings"] = meta("rope.scaling.original_context_length")
    return scaling


def _generation_config(reader: GGUFReader) -> dict:
    """bos/eos/pad ids; an end-of-turn token distinct from eos also stops generation."""
    ids = {
        "bos_token_id": _scalar(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _scalar(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _scalar(reader, "tokenizer.ggml.padding_token_id"),
    }
    eot = _scalar(reader, "tokenizer.ggml.eot_token_id")
    if eot is not None and ids["eos_token_id"] is not None and eot != ids["eos_token_id"]:
        ids["eos_token_id"] = [ids["eos_token_id"], eot]
    return {k: v for k, v in ids.items() if v is not None}


def _hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")


def _unpermute_rope_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo convert_hf_to_gguf.py's LlamaModel.permute.

    llama.cpp's rope rotates adjacent pairs (x0, x1), HF's rotates the two halves
    (x_i, x_{i+d/2}), so the converter reorders each head's rows from
    (2, d/2) to (d/2, 2). Swapping back restores HF's order exactly.
    """
    # w: [n_head * head_dim, ...]; rows (head, d/2, 2) -> (head, 2, d/2)
    return w.reshape(n_head, -1, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def _scalar(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """One metadata value as a Python str/int/float (float32s rounded to their shortest repr)."""
    f = reader.fields.get(key)
    if f is None or not f.data:
        return default
    part = f.parts[f.data[0]]
    if f.types[0] == GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    value = part[0]
    if f.types[0] == GGUFValueType.FLOAT32:
        return float(str(value))  # 9.999999747378752e-06 -> 1e-05, as in the original config
    return value.item()


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
