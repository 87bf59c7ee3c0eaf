"""Acceptance counters of speculative decoding, per draft position (torch-free: they cross to the
server's front end inside CoreStats, and `LLMEngine.print_mtp_statistics` prints them)."""
from __future__ import annotations

from dataclasses import dataclass, field


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
