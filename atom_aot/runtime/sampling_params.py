"""Per-request sampling parameters, validated where they are made."""
from __future__ import annotations

from dataclasses import dataclass, field


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

    def __post_init__(self):
        if isinstance(self.stop_strings, str):
            self.stop_strings = [self.stop_strings]
        self.stop_strings = list(self.stop_strings)
        self.stop_token_ids = list(self.stop_token_ids)
        _check(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k == -1 or self.top_k >= 0, f"top_k must be -1 (disabled) or >= 0, got {self.top_k}")
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        _check(self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        _check(all(isinstance(s, str) and s for s in self.stop_strings), "stop_strings must be non-empty strings")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
               "stop_token_ids must be non-negative integers")
        _check(self.seed is None or isinstance(self.seed, int), f"seed must be an integer, got {self.seed!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or 0 <= value <= 20, f"{name} must be between 0 and 20, got {value}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
