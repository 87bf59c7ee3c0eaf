"""One request's life in the engine: its tokens, its KV blocks, its progress and timings."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from atom_aot.runtime.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)   # a request is itself: compared by identity
class Sequence:
    """A request inside the engine core.

    There is no separate "prefill phase": `num_computed_tokens` counts the tokens whose KV is in
    the cache or is written by a step already launched, and each step computes some of the rest. A
    step that reaches the last token samples the next one.

    A sampled token the host has not read yet is *pending*: it counts in `num_tokens` (so the next
    step can be scheduled before it is read) but is not in `token_ids`, which holds known values only.
    """
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    block_size: int
    eos_token_ids: frozenset[int] = frozenset()
    arrival_time: float = field(default_factory=time.perf_counter)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_pending_tokens: int = 0       # sampled by launched steps, values not read yet: the last tokens
    num_cached_tokens: int = 0        # prompt tokens found in the prefix cache (last allocation)
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # hashes of the full blocks, in order
    finish_reason: str | None = None
    stop_token_id: int | None = None  # the token that finished it (an EOS or one of stop_token_ids), its last
    first_token_time: float | None = None
    finish_time: float | None = None
    generator: object | None = None   # the request's own RNG when params.seed is set (the runner's, a torch.Generator)
    grammar_matcher: object | None = None     # xgrammar's GrammarMatcher when params.grammar is set
    draft_token_ids: list[int] = field(default_factory=list)   # drafts for its next verify step (spec/)

    @property
    def num_tokens(self) -> int:
        """Known and pending tokens."""
        return len(self.token_ids) + self.num_pending_tokens

    @property
    def num_output_tokens(self) -> int:
        """Known and pending output tokens."""
        return self.num_tokens - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_blocks(self) -> int:
        return -(-self.num_tokens // self.block_size)

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def scored_prompt_positions(self, start: int, count: int) -> range:
        """Positions of [start, start + count) whose logits score the next prompt token (prompt_logprobs, echo)."""
        if self.params.prompt_logprobs is None:
            return range(0)
        return range(start, min(start + count, self.num_prompt_tokens - 1))

    def block_tokens(self, index: int) -> list[int]:
        return self.token_ids[index * self.block_size:(index + 1) * self.block_size]
