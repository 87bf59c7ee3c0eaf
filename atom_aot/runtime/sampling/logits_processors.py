"""What a request's parameters change in its logits before sampling, as vLLM does it: bad words,
min_tokens, logit_bias, allowed_token_ids, the grammar of structured outputs, then the repetition,
frequency and presence penalties.

All of it runs on the device, batched: the sparse changes (a bias, a masked EOS) are one indexed
add over the batch's (row, token) pairs, the grammar one bitmask, allowed_token_ids one boolean
mask, and the penalties read per-request token counts that live on the device and grow by each
step's sampled tokens (`record`, a queued scatter-add) — so with async scheduling, step N+1 sees
step N's token without the host reading it. A batch in which no request uses any of these costs
one pass over its parameters, nothing on the device.
"""
from __future__ import annotations

import torch

from atom_aot.runtime.sampling.structured_output import grammar_bitmask, apply_grammar_bitmask
from atom_aot.runtime.scheduling.sequence import Sequence
from atom_aot.runtime.transfer import to_device


class TokenCounts:
    """Per-request counts of output tokens and a mask of prompt tokens, one row (slot) per request
    that penalizes, in device tensors that grow as needed. A finished request's slot is reused: a
    step that still reads it was queued before the step that resets it (one stream, in order)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.slots: dict[Sequence, int] = {}
        self.counts = torch.zeros(0, 0, dtype=torch.int32, device=device)      # [slots, V]
        self.in_prompt = torch.zeros(0, 0, dtype=torch.bool, device=device)    # [slots, V]

    def slots_of(self, seqs: list[Sequence], vocab: int) -> torch.Tensor:
        """The slots of `seqs` ([n] on the device), giving a slot to each new request."""
        new = [seq for seq in seqs if seq not in self.slots]
        if new:
            self._release_finished()
            self._grow(len(self.slots) + len(new), vocab)
            used = set(self.slots.values())
            free = [slot for slot in range(self.counts.shape[0]) if slot not in used]
            for seq, slot in zip(new, free):
                self.slots[seq] = slot
            self._reset(new)
        return to_device([self.slots[seq] for seq in seqs], torch.int64, self.device)

    def record(self, seqs: list[Sequence], tokens: torch.Tensor) -> None:
        """Count the sampled tokens ([n], one per sequence, each with its slot) in their rows, on the device."""
        slots = to_device([self.slots[seq] for seq in seqs], torch.int64, self.device)
        self.counts.index_put_((slots, tokens), torch.ones_like(tokens, dtype=torch.int32), accumulate=True)

    def _release_finished(self) -> None:
        for seq in [seq for seq in self.slots if seq.is_finished]:
            del self.slots[seq]

    def _grow(self, needed: int, vocab: int) -> None:
        have = self.counts.shape[0]
        if needed <= have:
            return
        rows = max(needed, 2 * have)
        counts = torch.zeros(rows, vocab, dtype=torch.int32, device=self.device)
        in_prompt = torch.zeros(rows, vocab, dtype=torch.bool, device=self.device)
        if have:
            counts[:have], in_prompt[:have] = self.counts, self.in_prompt
        self.counts, self.in_prompt = counts, in_prompt

    def _reset(self, seqs: list[Sequence]) -> None:
        """New requests start with no output counted and their prompt tokens marked."""
        slots = [self.slots[seq] for seq in seqs]
        index = to_device(slots, torch.int64, self.device)
        self.counts[index] = 0
        self.in_prompt[index] = False
        rows = [slot for seq, slot in zip(seqs, slots) for _ in range(seq.num_prompt_tokens)]
        tokens = [t for seq in seqs for t in seq.token_ids[:seq.num_prompt_tokens]]
        self.in_prompt[to_device(rows, torch.int64, self.device), to_device(tokens, torch.int64, self.device)] = True


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, in_prompt: torch.Tensor, presence: torch.Tensor,
                    frequency: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
    """vLLM's penalties. logits, counts (output tokens), in_prompt: [n, V]; the penalties: [n].
    Repetition covers prompt and output tokens, presence and frequency the output only."""
    in_output = counts > 0
    seen = in_output | in_prompt
    repetition = repetition.unsqueeze(-1)
    logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
    return logits - frequency.unsqueeze(-1) * counts - presence.unsqueeze(-1) * in_output


def sparse_changes(seqs: list[Sequence]) -> tuple[list[int], list[int], list[float]]:
    """(row, token, value) triples to add to the logits: bad words and min_tokens' masked stops
    (-inf), then logit_bias. The loops are over each request's short lists, never the vocabulary."""
    rows, tokens, values = [], [], []
    for row, seq in enumerate(seqs):
        p = seq.params
        banned = _banned_words(seq) + (_stop_tokens(seq) if _before_min_tokens(seq) else [])
        rows += [row] * len(banned)
        tokens += banned
        values += [float("-inf")] * len(banned)
        rows += [row] * len(p.logit_bias)
        tokens += list(p.logit_bias)
        values += list(p.logit_bias.values())
    return rows, tokens, values


def _before_min_tokens(seq: Sequence) -> bool:
    # the scheduler counted the token being sampled as pending already: the output before it is one less
    return seq.num_output_tokens - 1 < seq.params.min_tokens


def _stop_tokens(seq: Sequence) -> list[int]:
    eos = [] if seq.params.ignore_eos else sorted(seq.eos_token_ids)
    return eos + list(seq.params.stop_token_ids)


def _banned_words(seq: Sequence) -> list[int]:
    """The last token of each bad word whose other tokens end the output (vLLM compares with the
    output only). A word of several tokens needs those tokens' values: its steps run synchronously."""
    words = seq.params.bad_words_token_ids
    if any(len(word) > 1 for word in words) and seq.num_pending_tokens > 1:
        raise RuntimeError(f"request {seq.request_id!r} has bad words of several tokens but "
                           f"{seq.num_pending_tokens - 1} earlier tokens are unread: its steps must run synchronously")
    output = seq.output_token_ids
    return [word[-1] for word in words
            if len(word) - 1 <= len(output) and (len(word) == 1 or output[len(output) - len(word) + 1:] == word[:-1])]


class LogitsProcessors:
    """The per-request logits changes of a batch; `record` counts what was sampled with them."""

    def __init__(self, device: torch.device):
        self.device = device
        self.token_counts = TokenCounts(device)

    def apply(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """logits: [N, V], row i of seqs[i]. Returns them changed (a new tensor, so that logprobs
        still read the model's own distribution, as vLLM's do by default) or, with nothing to
        change, the same tensor."""
        if not any(seq.params.processes_logits for seq in seqs):
            return logits
        logits = logits.clone()
        rows, tokens, values = sparse_changes(seqs)
        if rows:
            logits.index_put_((to_device(rows, torch.int64, self.device), to_device(tokens, torch.int64, self.device)),
                              to_device(values, logits.dtype, self.device), accumulate=True)
        allowed_rows = [row for row, seq in enumerate(seqs) if seq.params.allowed_token_ids]
        if allowed_rows:
            logits = self._keep_allowed(logits, seqs, allowed_rows)
        grammar_rows = [row for row, seq in enumerate(seqs) if seq.grammar_matcher is not None]
        if grammar_rows:
            bitmask = grammar_bitmask([seqs[row].grammar_matcher for row in grammar_rows], logits.shape[-1])
            index = to_device(grammar_rows, torch.int64, self.device)
            logits[index] = apply_grammar_bitmask(logits[index], to_device(bitmask, torch.int32, self.device))
        penalized = [row for row, seq in enumerate(seqs) if seq.params.penalizes]
        if penalized:
            logits = self._penalize(logits, [seqs[row] for row in penalized], penalized)
        return logits

    def record(self, seqs: list[Sequence], tokens: torch.Tensor) -> None:
        """After sampling (tokens: [N], row i of seqs[i]): count each penalized request's token."""
        penalized = [row for row, seq in enumerate(seqs) if seq.params.penalizes]
        if penalized:
            self.token_counts.record([seqs[row] for row in penalized],
                                     tokens[to_device(penalized, torch.int64, self.device)])

    def _keep_allowed(self, logits: torch.Tensor, seqs: list[Sequence], rows: list[int]) -> torch.Tensor:
        """allowed_token_ids: every other token of these rows to -inf (one mask, built from each
        request's list, never a loop over the vocabulary)."""
        blocked = torch.ones((len(rows), logits.shape[-1]), dtype=torch.bool, device=self.device)
        mask_rows = [i for i, row in enumerate(rows) for _ in seqs[row].params.allowed_token_ids]
        tokens = [t for row in rows for t in seqs[row].params.allowed_token_ids]
        blocked[to_device(mask_rows, torch.int64, self.device), to_device(tokens, torch.int64, self.device)] = False
        index = to_device(rows, torch.int64, self.device)
        logits[index] = logits[index].masked_fill(blocked, float("-inf"))
        return logits

    def _penalize(self, logits: torch.Tensor, seqs: list[Sequence], rows: list[int]) -> torch.Tensor:
        slots = self.token_counts.slots_of(seqs, logits.shape[-1])
        index = to_device(rows, torch.int64, self.device)
        penalties = [to_device([getattr(seq.params, name) for seq in seqs], logits.dtype, self.device)
                     for name in ("presence_penalty", "frequency_penalty", "repetition_penalty")]
        logits[index] = apply_penalties(logits[index], self.token_counts.counts[slots],
                                        self.token_counts.in_prompt[slots], *penalties)
        return logits
