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
    """One sequence's run: `verify_sampled_batch` of one."""
    return verify_sampled_batch([(target_probs, drafts, draft_probs, generator)])[0]


SampledItem = tuple[torch.Tensor, list[int], "torch.Tensor | None", torch.Generator]


def verify_sampled_batch(items: list[SampledItem]) -> list[list[int]]:
    """Each item: target_probs [k + 1, V], its k drafts, draft_probs [k, V] or None when each draft is a
    point mass, and the sequence's generator. Returns each sequence's run.

    Per sequence it draws k uniforms and one exponential variate per vocabulary entry from its
    generator whatever is accepted, so a seeded request draws the same numbers in any batch. The token
    after each possible first rejection (and the bonus after none) is chosen on the device, so the
    whole batch is read back once."""
    if not items:
        return []
    flags_and_tokens = []
    for target_probs, drafts, draft_probs, generator in items:
        k, device = len(drafts), target_probs.device
        draft_ids = torch.tensor(drafts, dtype=torch.int64, device=device)                 # [k]
        uniforms = torch.rand(k, generator=generator, device=device)                       # [k]
        noise = torch.empty_like(target_probs[0]).exponential_(generator=generator)        # [V]
        positions = torch.arange(k, device=device)
        p_draft = target_probs[positions, draft_ids]                                        # [k]
        q = (draft_probs if draft_probs is not None
             else torch.nn.functional.one_hot(draft_ids, target_probs.shape[-1]).to(target_probs.dtype))  # [k, V]
        rejected = uniforms * q[positions, draft_ids] >= p_draft   # u >= p/q, without dividing by a zero q
        # row a < k: the residual max(0, p_a - q_a) (a first rejection at a); row k: p_k (the bonus)
        residuals = torch.cat([(target_probs[:k] - q).clamp(min=0), target_probs[k:k + 1]])  # [k + 1, V]
        tokens = (residuals / noise).argmax(dim=-1)                                          # [k + 1]
        flags_and_tokens += [rejected.to(torch.int64), tokens]
    values = torch.cat(flags_and_tokens).tolist()                  # the batch's one read back
    runs, at = [], 0
    for _, drafts, _, _ in items:
        k = len(drafts)
        rejected, tokens = values[at:at + k], values[at + k:at + 2 * k + 1]
        at += 2 * k + 1
        accepted = rejected.index(1) if 1 in rejected else k
        runs.append(drafts[:accepted] + [tokens[accepted]])
    return runs
