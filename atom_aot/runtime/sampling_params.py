"""Per-request sampling parameters, validated where they are made."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

INT64_MAX = 2 ** 63 - 1           # the sampler's integer tensors are int64
GrammarKind = Literal["json_schema", "json_object", "regex", "choice", "ebnf"]


@dataclass(frozen=True)
class GrammarSpec:
    """What the output must match (structured outputs); the engine compiles it with xgrammar."""
    kind: GrammarKind
    value: str = ""                   # the JSON schema text, the regex, the EBNF; unused for json_object
    choices: tuple[str, ...] = ()     # kind "choice": the output is exactly one of these


@dataclass
class SamplingParams:
    temperature: float = 1.0          # 0 means greedy
    top_p: float = 1.0                # nucleus mass kept, in (0, 1]
    top_k: int = -1                   # -1 or 0 keeps the whole vocabulary
    min_p: float = 0.0                # drop tokens below min_p * p(max), in [0, 1]
    max_tokens: int | None = 64       # None: up to the context length
    ignore_eos: bool = False
    stop_strings: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None           # same seed, same tokens, whatever else is in the batch
    logprobs: int | None = None       # return the sampled token's logprob and this many top alternatives
    prompt_logprobs: int | None = None  # also score every prompt token (the `echo` of completions)
    # logits processors, vLLM's semantics (runtime/sampling/logits_processors.py applies them on the device)
    presence_penalty: float = 0.0     # minus this for every token already in the output
    frequency_penalty: float = 0.0    # minus this times the token's count in the output
    repetition_penalty: float = 1.0   # divides positive / multiplies negative logits of prompt and output tokens
    logit_bias: dict[int, float] = field(default_factory=dict)   # token id -> added to its logit
    min_tokens: int = 0               # EOS and stop_token_ids are masked until this many tokens are out
    bad_words_token_ids: list[list[int]] = field(default_factory=list)  # sequences never completed
    grammar: GrammarSpec | None = None  # structured output: only tokens the grammar allows
    # the text (output_processor.py): vLLM's meanings
    include_stop_str_in_output: bool = False  # a matched stop string stays at the end of the text
    skip_special_tokens: bool = True  # special tokens add no text
    allowed_token_ids: list[int] | None = None  # only these tokens may be sampled (vLLM's meaning)
    cache_salt: str | None = None     # enters the first block's prefix-cache hash: only equal salts share blocks
    priority: int = 0                 # --scheduling-policy priority: lower is served first (vLLM's meaning)

    def __post_init__(self):
        if isinstance(self.stop_strings, str):
            self.stop_strings = [self.stop_strings]
        self.stop_strings = list(self.stop_strings)
        self.stop_token_ids = list(self.stop_token_ids)
        self._check_tensor_bounds()
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k == -1 or self.top_k >= 0, f"top_k must be -1 (disabled) or >= 0, got {self.top_k}")
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        _check(self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        _check(all(isinstance(s, str) and s for s in self.stop_strings), "stop_strings must be non-empty strings")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
               "stop_token_ids must be non-negative integers")
        _check(self.seed is None or isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}")
        _check(-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        _check(-2 <= self.frequency_penalty <= 2, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        _check(self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _check(all(isinstance(t, int) and t >= 0 for t in self.logit_bias), "logit_bias keys must be token ids")
        _check(self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens,
               f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        self._check_allowed_token_ids()
        _check(_is_int_in(self.priority, -INT64_MAX - 1, INT64_MAX), f"priority must be an integer, got "
                                                                      f"{self.priority!r}")
        _check(self.cache_salt is None or (isinstance(self.cache_salt, str) and self.cache_salt),
               "cache_salt must be a non-empty string")
        _check(self.grammar is None or self.min_tokens == 0,
               "min_tokens cannot be combined with a structured output: the grammar decides where the output ends")
        _check(all(word and all(isinstance(t, int) and t >= 0 for t in word) for word in self.bad_words_token_ids),
               "bad_words_token_ids must be non-empty lists of token ids")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or 0 <= value <= 20, f"{name} must be between 0 and 20, got {value}")

    def _check_tensor_bounds(self) -> None:
        """What the sampler puts in tensors must fit them: a number out of range there would end the
        engine and every request it holds, not just this one."""
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                   f"{name} must be a finite number, got {value!r}")
        for name in ("top_k", "min_tokens"):
            _check(_is_int_in(getattr(self, name), -1, INT64_MAX), f"{name} must be an integer up to {INT64_MAX}, "
                                                                    f"got {getattr(self, name)!r}")
        for name in ("max_tokens", "logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or _is_int_in(value, 0, INT64_MAX), f"{name} must be an integer up to {INT64_MAX}, "
                                                                      f"got {value!r}")
        _check(self.seed is None or _is_int_in(self.seed, -2 ** 63, 2 ** 64 - 1),
               f"seed must be an integer in [-2**63, 2**64 - 1] (what a torch generator takes), got {self.seed!r}")
        token_ids = [*self.stop_token_ids, *self.logit_bias, *(t for word in self.bad_words_token_ids for t in word),
                     *(self.allowed_token_ids or [])]
        _check(all(_is_int_in(t, 0, INT64_MAX) for t in token_ids),
               f"token ids (stop_token_ids, logit_bias keys, bad_words_token_ids, allowed_token_ids) must be integers "
               f"in [0, {INT64_MAX}]")
        _check(all(isinstance(v, (int, float)) and math.isfinite(v) for v in self.logit_bias.values()),
               "logit_bias values must be finite numbers")

    def _check_allowed_token_ids(self) -> None:
        """A non-empty list that leaves something to sample: every other token gets -inf, so a grammar,
        or stop tokens masked until min_tokens, or one-token bad words, could mask the rest."""
        if self.allowed_token_ids is None:
            return
        self.allowed_token_ids = list(self.allowed_token_ids)
        _check(bool(self.allowed_token_ids), "allowed_token_ids must not be empty: no token could be sampled")
        _check(self.grammar is None, "allowed_token_ids cannot be combined with a structured output: the grammar "
                                     "decides which tokens may come")
        banned = {word[0] for word in self.bad_words_token_ids if len(word) == 1}
        if self.min_tokens:
            banned |= set(self.stop_token_ids)
        _check(not set(self.allowed_token_ids) <= banned, "allowed_token_ids leaves no token to sample: each of them "
                                                          "is a one-token bad word or a stop token before min_tokens")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalizes(self) -> bool:
        """Whether a penalty needs the request's token counts."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def processes_logits(self) -> bool:
        """Whether the sampler changes this request's logits before drawing (runtime/sampling/logits_processors.py)."""
        return bool(self.penalizes or self.logit_bias or self.min_tokens or self.bad_words_token_ids
                    or self.grammar is not None or self.allowed_token_ids)

    @property
    def needs_last_tokens(self) -> bool:
        """Whether each step's logits depend on the values of the tokens just sampled, on the host: a
        grammar's mask, a bad word of several tokens. Such a request's steps run synchronously."""
        return self.grammar is not None or any(len(word) > 1 for word in self.bad_words_token_ids)


def _is_int_in(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
