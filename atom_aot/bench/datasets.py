"""The prompts a serving benchmark sends: random token prompts, ShareGPT conversations, sonnet lines,
BurstGPT trace lengths.

Each sampler follows vLLM's `benchmark_dataset.py` so the same flags give the same kind of
workload, and returns `SampleRequest`s whose `prompt_len` is the token count the server will see.
"""
from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass

import numpy as np

from atom_aot.bench.tokenizer import count_tokens

SONNET_BASE_PROMPT = "Pick as many lines as you can from these poem lines:\n"


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    prompt_len: int              # tokens of `prompt` (before any server-side chat template)
    expected_output_len: int     # sent as max_tokens


def chat_wrap(tokenizer, prompt: str) -> str:
    """A user turn in the tokenizer's chat template, ready for the completions endpoint."""
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=False)


RANGE_MODES = ("atom", "vllm")


def length_bounds(length: int, range_ratio: float, range_mode: str) -> tuple[int, int]:
    """The inclusive range lengths are drawn from. atom (ATOM's and vLLM's older benchmark):
    [r * len, len], 1.0 = fixed; vllm (vLLM's newer one): [len * (1 - r), len * (1 + r)], 0 = fixed."""
    if range_mode == "atom":
        if not 0 <= range_ratio <= 1:
            raise ValueError(f"--random-range-ratio must be in [0, 1] (lengths in [r*len, len]), got {range_ratio}")
        low, high = int(length * range_ratio), length
    elif range_mode == "vllm":
        if not 0 <= range_ratio < 1:
            raise ValueError(f"--random-range-ratio must be in [0, 1) with --random-range-mode vllm, got {range_ratio}")
        low, high = int(length * (1 - range_ratio)), int(length * (1 + range_ratio))
    else:
        raise ValueError(f"--random-range-mode must be one of {', '.join(RANGE_MODES)}, got {range_mode!r}")
    return max(1, low), max(1, high)


def sample_random(tokenizer, num_requests: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                  prefix_len: int = 0, seed: int = 0, range_mode: str = "vllm") -> list[SampleRequest]:
    """Prompts of random tokens (no special tokens), lengths uniform in `length_bounds`, after a
    random prefix of `prefix_len` tokens that every prompt shares."""
    input_low, input_high = length_bounds(input_len, range_ratio, range_mode)
    output_low, output_high = length_bounds(output_len, range_ratio, range_mode)
    rng = np.random.default_rng(seed)
    allowed = np.array(sorted(set(range(tokenizer.vocab_size)) - set(tokenizer.all_special_ids)))
    input_lens = rng.integers(input_low, input_high + 1, size=num_requests)
    output_lens = rng.integers(output_low, output_high + 1, size=num_requests)
    prefix = allowed[rng.integers(0, len(allowed), size=prefix_len)].tolist()
    requests = []
    for n_in, n_out in zip(input_lens, output_lens):
        ids = prefix + allowed[rng.integers(0, len(allowed), size=int(n_in))].tolist()
        text = _text_of_length(tokenizer, ids, prefix_len + int(n_in))
        requests.append(SampleRequest(text, count_tokens(tokenizer, text), int(n_out)))
    return requests


def _text_of_length(tokenizer, ids: list[int], length: int, tries: int = 4) -> str:
    """Text that re-encodes to `length` tokens (decode -> encode is not an identity for BPE, so
    adjust and retry; the last try is taken as it is, and its real length is what gets reported)."""
    text = tokenizer.decode(ids)
    for _ in range(tries):
        encoded = tokenizer(text, add_special_tokens=False).input_ids
        if len(encoded) == length:
            break
        encoded = (encoded + ids)[:length]
        text = tokenizer.decode(encoded)
    return text


def sample_sharegpt(tokenizer, path: str, num_requests: int, output_len: int | None = None,
                    seed: int = 0) -> list[SampleRequest]:
    """First human turn as the prompt, the reply's length as the output length (or `output_len`);
    pairs too short (< 4 tokens) or too long (prompt > 1024, total > 2048) are skipped, as vLLM does."""
    with open(path, encoding="utf-8") as f:
        conversations = [c["conversations"] for c in json.load(f) if len(c.get("conversations", [])) >= 2]
    random.Random(seed).shuffle(conversations)
    requests = []
    for conv in conversations:
        if len(requests) == num_requests:
            break
        prompt, reply = conv[0]["value"], conv[1]["value"]
        prompt_len = count_tokens(tokenizer, prompt)
        out_len = output_len if output_len is not None else len(tokenizer(reply, add_special_tokens=False).input_ids)
        if prompt_len < 4 or out_len < 4 or prompt_len > 1024 or prompt_len + out_len > 2048:
            continue
        requests.append(SampleRequest(prompt, prompt_len, out_len))
    if len(requests) < num_requests:
        raise ValueError(f"{path} has only {len(requests)} usable conversations, fewer than --num-prompts "
                         f"{num_requests}")
    return requests


def sample_sonnet(tokenizer, path: str, num_requests: int, input_len: int = 550, output_len: int = 150,
                  prefix_len: int = 200, chat_formatted: bool = True, seed: int = 0) -> list[SampleRequest]:
    """"Pick as many lines as you can" + a shared prefix of poem lines + random lines, up to
    `input_len` tokens after the chat template. `chat_formatted` sends the templated text (for the
    completions endpoint); otherwise the raw prompt (the chat endpoint templates it)."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f.readlines() if line.strip()]
    base_len = count_tokens(tokenizer, chat_wrap(tokenizer, SONNET_BASE_PROMPT))
    if input_len <= base_len:
        raise ValueError(f"--sonnet-input-len must be more than the {base_len} tokens of the base prompt")
    avg_line = sum(len(tokenizer(line, add_special_tokens=False).input_ids) for line in lines) / len(lines)
    num_lines = round((input_len - base_len) / avg_line)
    prefix_lines = lines[:max(round((prefix_len - base_len) / avg_line), 0)]
    rng = random.Random(seed)
    requests = []
    for _ in range(num_requests * 100):
        if len(requests) == num_requests:
            return requests
        prompt = SONNET_BASE_PROMPT + "".join(prefix_lines + rng.choices(lines, k=num_lines - len(prefix_lines)))
        formatted = chat_wrap(tokenizer, prompt)
        prompt_len = count_tokens(tokenizer, formatted)
        if prompt_len <= input_len:
            requests.append(SampleRequest(formatted if chat_formatted else prompt, prompt_len, output_len))
    raise ValueError(f"could not draw {num_requests} sonnet prompts of at most {input_len} tokens from {path}")


def sample_burstgpt(tokenizer, path: str, num_requests: int, seed: int = 0) -> list[SampleRequest]:
    """BurstGPT's trace (its CSV: `Model`, `Request tokens`, `Response tokens`, ...): the GPT-4 rows with a
    response, drawn with replacement when the trace has fewer than `num_requests`, as vLLM does; each row
    becomes a random-token prompt of its request length with its response length as max_tokens."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = [(int(r["Request tokens"]), int(r["Response tokens"])) for r in csv.DictReader(f)
                if r.get("Model") == "GPT-4" and int(r.get("Response tokens") or 0) > 0]
    if not rows:
        raise ValueError(f"{path} has no GPT-4 rows with a response (columns Model, Request tokens, Response tokens)")
    rng = np.random.default_rng(seed)
    picked = rng.choice(len(rows), size=num_requests, replace=num_requests > len(rows))
    allowed = np.array(sorted(set(range(tokenizer.vocab_size)) - set(tokenizer.all_special_ids)))
    requests = []
    for index in picked:
        n_in, n_out = rows[int(index)]
        ids = allowed[rng.integers(0, len(allowed), size=max(n_in, 1))].tolist()
        text = _text_of_length(tokenizer, ids, len(ids))
        requests.append(SampleRequest(text, count_tokens(tokenizer, text), n_out))
    return requests
