"""The exact rejection sampler of speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Given the target's distributions p at the last known token and after each of k draft tokens, and
the distributions q the drafts were drawn from, it returns the accepted drafts and one more token:
draft x_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection the
token is drawn from normalize(max(0, p_i - q_i)) and the run ends; when all k are accepted a bonus
token is drawn from p_k. Each emitted token is then distributed exactly as sampling from p would
give. A proposer that guesses (n-gram, a greedy draft) has q_i = one-hot(x_i): acceptance is
p_i(x_i) and the residual is p_i without x_i.

Greedy requests take the target's argmax at every position instead, so their tokens equal
non-speculative greedy decoding token for token.
"""
from __future__ import annotations

import torch


def verify_greedy(chosen: list[int], drafts: list[int]) -> list[int]:
    """chosen: the target's argmax at the k + 1 positions (the caller reads a whole batch's back at
    once). The drafts that match it, then the argmax after them."""
    run = []
    for draft, target in zip(drafts, chosen):
        if draft != target:
            break
        run.append(draft)
    return run + [chosen[len(run)]]


def verify_sampled(target_probs: torch.Tensor, drafts: list[int], draft_probs: torch.Tensor | None,
                   generator: torch.Generator) -> list[int]:
    """target_probs: [k + 1, V]; draft_probs: [k, V], or None when each draft is a point mass.

    Draws k uniforms and one exponential variate per vocabulary entry from `generator` whatever
    is accepted, so a seeded request draws the same numbers in any batch."""
    k = len(drafts)
    draft_ids = torch.tensor(drafts, dtype=torch.int64, device=target_probs.device)       # [k]
    uniforms = torch.rand(k, generator=generator, device=target_probs.device)              # [k]
    noise = torch.empty_like(target_probs[0]).exponential_(generator=generator)            # [V]
    positions = torch.arange(k, device=target_probs.device)
    p_draft = target_probs[positions, draft_ids]                                            # [k]
    q_draft = draft_probs[positions, draft_ids] if draft_probs is not None else torch.ones_like(p_draft)
    rejected = (uniforms * q_draft >= p_draft).tolist()     # u >= p/q, without dividing by a zero q
    accepted = rejected.index(True) if True in rejected else k
    if accepted == k:
        last = target_probs[k]                                                              # the bonus: from p_k
    else:
        q = (draft_probs[accepted] if draft_probs is not None
             else torch.nn.functional.one_hot(draft_ids[accepted], target_probs.shape[-1]).to(target_probs.dtype))
        last = (target_probs[accepted] - q).clamp(min=0)                                    # [V] the residual
    return drafts[:accepted] + [int((last / noise).argmax())]
