"""What crosses between the engine's parts, torch-free: a step's results as the model runner hands them to the
engine core, what the engine core hands out per step (these cross to the server's front end), and its counters,
speculative decoding's acceptance among them (`LLMEngine.print_mtp_statistics` prints those)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprobs:
    """The chosen token's log-probability and the top alternatives (under the model's distribution)."""
    token_id: int
    logprob: float
    rank: int
    top: list[tuple[int, float]]


@dataclass
class StepOutput:
    """An ordinary step's results, per batch sequence."""
    sampled: list[int | None]                      # None: still in its prompt
    logprobs: list[TokenLogprobs | None]
    prompt_logprobs: list[list[TokenLogprobs] | None]


@dataclass
class VerifiedOutput:
    """A verify step's results (speculative decoding), per batch sequence."""
    runs: list[list[int]]                          # accepted drafts, then the target's token
    logprobs: list[list[TokenLogprobs] | None]     # per token of the run, for sequences that asked


@dataclass
class CoreOutput:
    """What one step produced for one request."""
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_token_id: int | None = None    # finished by this token (an EOS or a stop token): the last of new_token_ids
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


@dataclass
class SpecCounters:
    method: str                     # the proposer: mtp, ngram or draft
    num_speculative_tokens: int     # K
    num_verified: int = 0           # sequence-steps verified: each emitted 1 + its accepted drafts
    proposed: list[int] = field(default_factory=list)   # [K] drafts proposed at position i
    accepted: list[int] = field(default_factory=list)   # [K] drafts accepted at position i

    def __post_init__(self):
        self.proposed = self.proposed or [0] * self.num_speculative_tokens
        self.accepted = self.accepted or [0] * self.num_speculative_tokens

    def record(self, num_proposed: int, num_accepted: int) -> None:
        """One sequence's verification: drafts 0..num_proposed-1 proposed, the first num_accepted kept."""
        self.num_verified += 1
        for i in range(num_proposed):
            self.proposed[i] += 1
            self.accepted[i] += i < num_accepted

    def snapshot(self) -> SpecCounters:
        return SpecCounters(self.method, self.num_speculative_tokens, self.num_verified,
                            list(self.proposed), list(self.accepted))

    def plus(self, other: SpecCounters) -> SpecCounters:
        """The counters of two engines (data-parallel replicas) added up."""
        return SpecCounters(self.method, self.num_speculative_tokens, self.num_verified + other.num_verified,
                            [a + b for a, b in zip(self.proposed, other.proposed)],
                            [a + b for a, b in zip(self.accepted, other.accepted)])

    @property
    def acceptance_per_position(self) -> list[float]:
        """Of the drafts proposed at position i, the share accepted (0 where none were proposed)."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted, self.proposed)]

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verified sequence-step: 1 (the target's own) + accepted drafts."""
        return 1 + sum(self.accepted) / self.num_verified if self.num_verified else 0.0

    def summary(self) -> dict:
        return {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
                "num_verified": self.num_verified, "proposed_total": sum(self.proposed),
                "accepted_total": sum(self.accepted), "acceptance_rate":
                sum(self.accepted) / sum(self.proposed) if sum(self.proposed) else 0.0,
                "acceptance_per_position": self.acceptance_per_position,
                "mean_accepted_length": self.mean_accepted_length}

    def format(self) -> str:
        s = self.summary()
        lines = [f"speculative decoding ({s['method']}, K={s['num_speculative_tokens']}; verify steps run "
                 f"synchronously): {s['num_verified']} sequence-steps verified, {s['accepted_total']} of "
                 f"{s['proposed_total']} drafts accepted ({s['acceptance_rate']:.1%}), mean accepted length "
                 f"{s['mean_accepted_length']:.2f} tokens per step"]
        lines += [f"  position {i}: {a} / {p} accepted ({r:.1%})" for i, (a, p, r)
                  in enumerate(zip(self.accepted, self.proposed, self.acceptance_per_position))]
        return "\n".join(lines)
