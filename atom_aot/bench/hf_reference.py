"""The Hugging Face transformers side of our comparisons: the same weights and tokenizer, run by
transformers, so accuracy and speed ratios compare engines, not checkpoints.

A GGUF is dequantized with our reader into transformers' model class (what `tests/test_parity.py`
checks token for token); a HF folder loads as usual.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from atom_aot.bench.tokenizer import tokenizer_source


def load_model(model: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """transformers' CausalLM for a GGUF file or a HF folder, in eval mode."""
    if Path(model).suffix == ".gguf":
        hf = _from_gguf(model, dtype)
    else:
        from transformers import AutoModelForCausalLM
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    return hf.to(device).eval()


def _from_gguf(path: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM
    from atom_aot.build.gguf_reader import read_gguf
    ckpt = read_gguf(path)
    config = AutoConfig.for_model(**ckpt.config)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(dict(ckpt.tensors()), strict=False)
    if unexpected or not set(missing) <= {"lm_head.weight"}:
        raise ValueError(f"{path}: the GGUF's tensors do not fit {type(model).__name__} "
                         f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})")
    model.tie_weights()
    model.generation_config.eos_token_id = ckpt.generation_config.get("eos_token_id")
    model.generation_config.pad_token_id = ckpt.generation_config.get("pad_token_id")
    return model.to(dtype)


def load_tokenizer(model: str):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tokenizer_source(model))


@dataclass
class TokenTimes:
    """A streamer that stamps each generated token: first token vs the rest, as a server reports."""
    start: float = 0.0
    stamps: list[float] = field(default_factory=list)
    _prompt_seen: bool = False

    def put(self, value) -> None:
        if not self._prompt_seen:       # generate() hands the prompt over first
            self._prompt_seen = True
            return
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass

    @property
    def ttft(self) -> float:
        return self.stamps[0] - self.start

    @property
    def decode_tok_s(self) -> float:
        """Tokens per second after the first (1 / TPOT)."""
        return (len(self.stamps) - 1) / (self.stamps[-1] - self.stamps[0]) if len(self.stamps) > 1 else 0.0


def eos_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [] if eos is None else list(eos) if isinstance(eos, (list, tuple)) else [eos]


@torch.inference_mode()
def greedy(model, prompt_ids: list[int], max_new_tokens: int, tokenizer=None, stop_strings: list[str] | None = None,
           ignore_eos: bool = False) -> tuple[list[int], TokenTimes]:
    """One prompt, no padding, greedy: the generated ids (eos included, as the engine reports it)
    and their timestamps."""
    times = TokenTimes()
    eos = eos_ids(model)
    kwargs = {"stop_strings": stop_strings, "tokenizer": tokenizer} if stop_strings else {}
    ids = torch.tensor([prompt_ids], device=model.device)
    times.start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         min_new_tokens=max_new_tokens if ignore_eos else None, do_sample=False,
                         eos_token_id=None if ignore_eos else eos, pad_token_id=eos[0] if eos else 0,
                         streamer=times, **kwargs)
    return out[0, len(prompt_ids):].tolist(), times
