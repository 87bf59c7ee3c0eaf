"""What the engine core hands out: per step, and its counters. Torch-free: these cross to the server's front end."""
from __future__ import annotations

from dataclasses import dataclass, field

from atom_aot.runtime.spec.stats import SpecCounters


@dataclass
class TokenLogprobs:
    """The chosen token's log-probability and the top alternatives (under the model's distribution)."""
    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


@dataclass
class CoreOutput:
    """What one step produced for one request."""
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] | None = None  # complete list, sent once
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_time: float | None = None


@dataclass(frozen=True)
class CoreStats:
    """Counters for /metrics and tests (plain numbers, safe to send between processes)."""
    num_running: int
    num_waiting: int
    kv_blocks_total: int
    kv_blocks_free: int
    prefix_cache_queries: int          # full prompt blocks looked up in the prefix cache
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    synchronous_steps_total: int = 0   # steps not overlapped because a request needed its last tokens read
    spec: SpecCounters | None = None   # speculative decoding's acceptance counters (None: it is off)
