"""Continuous batching over the paged KV cache, with chunked prefill under a per-step token budget.

A step with prompt work is a mixed step: every running decode first (one token each, vLLM v1's
rule, so no decode waits on a prefill), then the prompts with the rest of the budget. A prompt in
progress (longer than the budget: chunked) takes at most half of that rest while new prompts wait,
and new prompts the other half, so neither a long prompt nor a stream of short ones holds the other
back; budget a prompt leaves unused goes back to the prompts in progress. A step without prompt work
is a decode step. With speculative decoding decodes are verify steps of their own, and prompt work
goes first. When a step runs out of blocks the youngest running sequence is preempted:
its blocks are freed and it is recomputed later from its tokens (prompt plus what it generated), so
preemption never loses output. An aborted request stops at the next step: a long prompt at the end of
the chunk in flight.

Accounting happens when a batch is scheduled: each sequence's `num_computed_tokens` advances and a
sequence that samples gets a pending token, so the next batch can be scheduled (and launched)
before the host reads this one's tokens (async scheduling). `update` fills the tokens in and
checks stops. A stop that depends on a token's value (EOS, stop_token_ids) is therefore seen one
step late: the sequence may be in the batch after it, whose result for it is dropped. Length
stops (max_tokens, max_model_len) are known at schedule time: nothing is scheduled past them.

Speculative decoding (`SchedulerConfig.speculation`): a decode step verifies, for each sequence, its
last token and up to K draft tokens, which the speculative runner proposed after the step before and
handed over (`update_draft_token_ids`): the scheduler reads them, it never runs a proposer. Slots are
allocated for all of them (and `lookahead_slots` more, where the proposer writes its own cache layer
past them after the step), but only the last token counts as computed when the batch is made. `update_verified` appends the accepted
run (stopping at the first stop) and sets the computed count to the tokens whose KV is right: the
slots of rejected drafts stay in the sequence's table and its next tokens overwrite them. Verify
steps run synchronously (the engine core reads each before scheduling the next).

Freeing the blocks of a sequence that a launched step still writes (it stopped or was preempted
while that step runs) is safe because every step runs on one CUDA stream, in order: a later step
that reuses the blocks writes them after the earlier one is done with them.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator

from atom_aot.errors import RequestError
from atom_aot.runtime.config import SCHEDULING_POLICIES, RuntimeConfig, max_scored_prompt_rows
from atom_aot.runtime.scheduling.block_manager import BlockManager
from atom_aot.runtime.scheduling.priority_queue import PriorityQueue
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.scheduling.sequence import Sequence, SequenceStatus


def num_scored(seq: Sequence, start: int, count: int) -> int:
    """Logits rows a chunk [start, start + count) of `seq` adds to score its prompt (prompt_logprobs)."""
    return len(seq.scored_prompt_positions(start, count))


def scored_chunk(seq: Sequence, start: int, count: int, rows_left: int) -> int:
    """`count` cut so that the chunk scores at most `rows_left` prompt positions (0: none fits this step)."""
    return count if num_scored(seq, start, count) <= rows_left else max(rows_left, 0)


@dataclass(frozen=True)
class SpeculationShape:
    """What the scheduler knows of speculative decoding (runtime/spec/ proposes and verifies): the most draft
    tokens a verify step checks per sequence, the slots kept past a sampling step's tokens for the proposer's own
    cache writes after it (the MTP layer's chained steps), and whether every decode is a verify step (a proposer
    that reads each step's hidden states) or only one with drafts."""
    num_speculative_tokens: int
    lookahead_slots: int = 0
    verify_every_decode: bool = False


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's view of the runtime config: exactly the values it reads. Made from a RuntimeConfig, which
    checked them (`from_runtime`); a config made directly is checked for what the scheduler itself relies on."""
    max_num_seqs: int              # sequences in one batch
    max_num_batched_tokens: int    # tokens computed in one step; longer prompts are chunked
    max_model_len: int             # prompt + output tokens of one sequence (at most the artifact's limit)
    scheduler_delay_factor: float  # wait this many last-prefill latencies to gather prompts
    scheduling_policy: str = "fcfs"  # or "priority": waiting by (priority, arrival); preempt the lowest first
    speculation: SpeculationShape | None = None     # None: no speculative decoding

    def __post_init__(self):
        if self.max_num_batched_tokens is None:
            raise ValueError("the scheduler needs a step budget: RuntimeConfig.for_target(arch) gives the target's")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, got "
                             f"{self.scheduling_policy!r}")

    @classmethod
    def from_runtime(cls, config: RuntimeConfig, max_model_len: int,
                     speculation: SpeculationShape | None = None) -> SchedulerConfig:
        """`max_model_len`: the one the engine serves (RuntimeConfig.served_max_model_len)."""
        return cls(max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                   max_model_len=max_model_len, scheduler_delay_factor=config.scheduler_delay_factor,
                   scheduling_policy=config.scheduling_policy, speculation=speculation)


def draft_limit(seq: Sequence, num_speculative_tokens: int, max_model_len: int) -> int:
    """The most draft tokens the next verify step of `seq` may check: K, and what max_model_len and max_tokens
    leave room for (the verify step emits one token more than it accepts)."""
    limit = min(num_speculative_tokens, max_model_len - seq.num_tokens - 1)
    if seq.params.max_tokens is not None:
        limit = min(limit, seq.params.max_tokens - seq.num_output_tokens - 1)
    return max(0, limit)


class SequenceQueue:
    """Sequences in order, found and removed by request id in O(1).

    A client that gives up on a request of 256,000 sequences aborts them all at once; a queue
    scanned once per aborted id kept the engine busy for minutes."""

    def __init__(self):
        self._seqs: OrderedDict[str, Sequence] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seqs)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._seqs.values())

    def __reversed__(self) -> Iterator[Sequence]:
        return reversed(self._seqs.values())

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._seqs

    def first(self) -> Sequence:
        return next(iter(self._seqs.values()))

    def append(self, seq: Sequence) -> None:
        self._seqs[seq.request_id] = seq

    def appendleft(self, seq: Sequence) -> None:
        self._seqs[seq.request_id] = seq
        self._seqs.move_to_end(seq.request_id, last=False)

    def popleft(self) -> Sequence:
        return self._seqs.popitem(last=False)[1]

    def remove(self, seq: Sequence) -> None:
        del self._seqs[seq.request_id]

    def pop(self, request_id: str) -> Sequence | None:
        return self._seqs.pop(request_id, None)

    def get(self, request_id: str) -> Sequence | None:
        return self._seqs.get(request_id)


@dataclass
class _PromptStep:
    """A mixed step being filled: its sequences and their token counts so far, and the token budget and
    scored prompt rows (prompt logprobs) it has left."""
    seqs: list[Sequence]
    counts: list[int]
    budget: int
    scoring: int

    def add(self, seq: Sequence, count: int, num_scored_rows: int) -> None:
        self.seqs.append(seq), self.counts.append(count)
        self.budget -= count
        self.scoring -= num_scored_rows

    def widen(self, index: int, count: int, scoring_left: int) -> None:
        self.budget -= count - self.counts[index]
        self.counts[index] = count
        self.scoring = scoring_left


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 clock: Callable[[], float] = time.perf_counter):
        self.config = config
        self.block_manager = block_manager
        self.clock = clock               # the time source of latencies and of sequences' timings
        # first in, first out, preempted sequences back at the front; or by priority, then arrival
        self.waiting = SequenceQueue() if config.scheduling_policy == "fcfs" else PriorityQueue()
        self.running = SequenceQueue()   # oldest first: the youngest is preempted first
        self.num_preemptions = 0
        self._last_prefill_latency = 0.0
        self._freed: list[Sequence] = []   # blocks freed since the last batch: handed to the runner with the next

    # -- intake -----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.waiting or seq.request_id in self.running:
            raise RequestError(f"request id {seq.request_id!r} is already in the engine; give each request its own id")
        self.waiting.append(seq)

    def abort(self, request_id: str, reason: str = "abort") -> Sequence | None:
        """Finish a request early (a client went away, or a stop string matched); O(1).
        None if it is not waiting or running (finished already, or never added)."""
        seq = self.waiting.pop(request_id)
        if seq is None:
            seq = self.running.pop(request_id)
        if seq is not None:
            self.finish(seq, reason)
        return seq

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def update_draft_token_ids(self, drafts: dict[str, list[int]]) -> None:
        """The speculative runner's drafts (request id -> tokens) for the next verify step of running sequences;
        a sequence that finished or was preempted since is skipped (its drafts would follow tokens it no longer
        has in the cache)."""
        for request_id, draft in drafts.items():
            seq = self.running.get(request_id)
            if seq is not None and seq.status == SequenceStatus.RUNNING:
                seq.draft_token_ids = list(draft)

    # -- scheduling -------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        now = self.clock()
        partials = bool(self._partial_prefills())
        if partials or (self.waiting and self._delay_passed(now)):
            batch = self._schedule_mixed(now)
            if batch is not None:
                return batch
        return self._schedule_decode(now)

    def _partial_prefills(self) -> list[Sequence]:
        return [seq for seq in self.running if seq.num_uncomputed_tokens > 1]

    def _delay_passed(self, now: float) -> bool:
        """vLLM's delay factor: hold new prompts back a little to batch them, never when idle."""
        if self.config.scheduler_delay_factor <= 0 or not self.running:
            return True
        # first in, first out, and preemption returns the youngest running sequence first: the
        # head has waited longest (read in O(1): the waiting queue may hold 100,000s)
        waited = now - self.waiting.first().arrival_time
        return waited > self.config.scheduler_delay_factor * self._last_prefill_latency

    def _schedule_mixed(self, now: float) -> ScheduledBatch | None:
        """Decodes, then prompts in progress (half the rest while new ones wait), then new prompts, then
        what is left back to the prompts in progress. A decode step if no prompt token fits."""
        decodes = self._decodes_beside_prompts()
        budget = self.config.max_num_batched_tokens - len(decodes)
        step = _PromptStep(list(decodes), [1] * len(decodes), budget, max_scored_prompt_rows(self.config.max_num_seqs))
        in_progress = budget - budget // 2 if self.waiting else budget
        self._continue_prompts(step, in_progress)
        self._admit_waiting(step)
        self._extend_prompts(step)
        if len(step.seqs) == len(decodes):
            return self._commit(decodes, [1] * len(decodes), is_prefill=False, now=now) if decodes else None
        return self._commit(step.seqs, step.counts, is_prefill=True, now=now)

    def _decodes_beside_prompts(self) -> list[Sequence]:
        """The running decodes a mixed step takes first, their slots reserved: none with speculative decoding (its
        decodes are verify steps), nor when they would take the whole budget (then prompt work goes first)."""
        if self.config.speculation is not None:
            return []
        candidates = self._decode_candidates()
        if len(candidates) >= self.config.max_num_batched_tokens:
            return []
        scheduled = []
        for seq in candidates:
            if seq.status == SequenceStatus.RUNNING and self._reserve(seq, 1, scheduled):   # not preempted meanwhile
                scheduled.append(seq)
        return scheduled

    def _continue_prompts(self, step: _PromptStep, limit: int) -> None:
        """Next chunks of prompts in progress, `limit` tokens at most (a slot short: preempted, skipped)."""
        for seq in self._partial_prefills():
            count = min(seq.num_uncomputed_tokens, limit)
            if count == 0:
                break
            if seq.status != SequenceStatus.RUNNING:   # preempted to make room for an older one
                continue
            count = scored_chunk(seq, seq.num_computed_tokens, count, step.scoring)
            if count and self._reserve(seq, count, step.seqs):
                step.add(seq, count, num_scored(seq, seq.num_computed_tokens, count))
                limit -= count

    def _admit_waiting(self, step: _PromptStep) -> None:
        """New prompts, first in first out, with what the budget has left."""
        while self.waiting and step.budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting.first()
            if seq.num_pending_tokens:                  # preempted before its last token was read: next step
                break
            # a prompt scored token by token (prompt logprobs) cannot skip cached tokens
            cached = [] if seq.params.prompt_logprobs is not None else self.block_manager.find_cached_prefix(seq)
            uncomputed = seq.num_tokens - len(cached) * self.block_manager.block_size
            # Admit a prompt only if all of it fits now, not just its first chunk: one admitted on
            # its first chunk could preempt itself at a later chunk and be readmitted, forever,
            # while the older sequences holding the blocks wait on the prefill.
            if not self.block_manager.can_allocate_with_prefix(seq, cached, uncomputed):
                break                                   # waiting sequences hold no blocks
            count = scored_chunk(seq, seq.num_tokens - uncomputed, min(uncomputed, step.budget), step.scoring)
            if count == 0:
                break                                   # first in, first out: the next step scores it
            self.block_manager.allocate_prefix(seq, cached)
            self.block_manager.allocate(seq, count)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            step.add(seq, count, num_scored(seq, seq.num_tokens - uncomputed, count))

    def _extend_prompts(self, step: _PromptStep) -> None:
        """Budget the new prompts left unused goes to the chunks of prompts in progress, where free slots allow."""
        for i, seq in enumerate(step.seqs):
            count = step.counts[i]
            if step.budget <= 0:
                return
            if seq.num_uncomputed_tokens <= count:
                continue                                # a decode, or a prompt whose chunk ends it
            start = seq.num_computed_tokens
            rows = step.scoring + num_scored(seq, start, count)
            wider = scored_chunk(seq, start, min(seq.num_uncomputed_tokens, count + step.budget), rows)
            if wider > count and self.block_manager.can_allocate(seq, wider):
                self.block_manager.allocate(seq, wider)
                step.widen(i, wider, rows - num_scored(seq, start, wider))

    def _decode_candidates(self) -> list[Sequence]:
        """Running sequences whose next step is a decode: not preempted, past their prompt, and not ending
        with a pending last token (they finish when it is read)."""
        return [seq for seq in self.running if seq.num_uncomputed_tokens == 1 and not self._reached_length(seq)]

    def _schedule_decode(self, now: float) -> ScheduledBatch | None:
        spec = self.config.speculation
        scheduled, drafts = [], []
        for seq in self._decode_candidates():
            if seq.status != SequenceStatus.RUNNING:
                continue                          # preempted meanwhile
            draft = tuple(seq.draft_token_ids[:draft_limit(seq, spec.num_speculative_tokens,
                                                           self.config.max_model_len)]) if spec else ()
            # slots for the newest token, its drafts, and past them what the proposer writes after the step
            if self._reserve(seq, 1 + len(draft) + (spec.lookahead_slots if spec else 0), scheduled):
                scheduled.append(seq), drafts.append(draft)
        if not scheduled:
            return None
        for seq in scheduled:
            seq.draft_token_ids = []              # taken: the next drafts follow this step
        if spec is None or not (spec.verify_every_decode or any(drafts)):
            return self._commit(scheduled, [1] * len(scheduled), is_prefill=False, now=now)
        return self._commit(scheduled, [1 + len(d) for d in drafts], is_prefill=False, now=now,
                            draft_token_ids=tuple(drafts))

    def _commit(self, seqs: list[Sequence], counts: list[int], is_prefill: bool, now: float,
                draft_token_ids: tuple[tuple[int, ...], ...] | None = None) -> ScheduledBatch:
        """The batch, and the accounting it implies: computed tokens advance (draft tokens do not:
        they are not the sequence's until accepted), samples are pending."""
        batch = ScheduledBatch.of(tuple(seqs), tuple(counts), is_prefill, tuple(self._freed), now, draft_token_ids)
        self._freed.clear()
        drafts = draft_token_ids or [()] * len(seqs)
        if is_prefill and self.config.speculation is not None and self.config.speculation.lookahead_slots:
            self._reserve_lookahead(batch)
        for seq, count, draft, samples in zip(seqs, counts, drafts, batch.sampling):
            seq.num_computed_tokens += count - len(draft)
            seq.num_pending_tokens += samples
        return batch

    def _reserve_lookahead(self, batch: ScheduledBatch) -> None:
        """Slots past the last prompt token of each prompt this step finishes, where the free pool has them (no
        preemption for these): the proposer's chained steps write there after the step, as far as slots reach."""
        lookahead = self.config.speculation.lookahead_slots
        for seq, count, samples in zip(batch.seqs, batch.num_new_tokens, batch.sampling):
            if samples and self.block_manager.can_allocate(seq, count + lookahead):
                self.block_manager.allocate(seq, count + lookahead)

    def _reserve(self, seq: Sequence, count: int, scheduled: list[Sequence]) -> bool:
        """Allocate slots for `count` tokens of a running sequence, preempting the youngest
        unscheduled sequences until they fit. False if `seq` itself had to be preempted."""
        while not self.block_manager.can_allocate(seq, count):
            victim = self._victim(scheduled)
            self._preempt(victim)
            if victim is seq:
                return False
        self.block_manager.allocate(seq, count)
        return True

    def _victim(self, scheduled: list[Sequence]) -> Sequence:
        """The running sequence preempted next: the youngest unscheduled one, or under the priority policy
        the one of the lowest priority (highest value), the youngest of equals (vLLM's choice)."""
        candidates = (s for s in reversed(self.running) if s not in scheduled)
        if self.config.scheduling_policy == "fcfs":
            return next(candidates)
        return max(candidates, key=lambda s: (s.params.priority, s.arrival_time))

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._free_blocks(seq)
        seq.draft_token_ids = []                  # they follow tokens it recomputes
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def _reached_length(self, seq: Sequence) -> bool:
        """Whether its known and pending tokens reach max_tokens or max_model_len."""
        max_tokens = seq.params.max_tokens
        return ((max_tokens is not None and seq.num_output_tokens >= max_tokens)
                or seq.num_tokens >= self.config.max_model_len)

    # -- after the step ---------------------------------------------------------------------
    def update(self, batch: ScheduledBatch, sampled: list[int | None]) -> list[Sequence]:
        """Fill in the batch's sampled tokens, register full blocks, finish what stops.

        Returns the sequences that got a new token. A sequence that finished after the batch was
        scheduled (a stop seen one step late, an abort) gets nothing: its result is dropped.
        """
        if batch.is_prefill:
            self._last_prefill_latency = self.clock() - batch.scheduled_at
        advanced = []
        for seq, samples, token in zip(batch.seqs, batch.sampling, sampled):
            if seq.is_finished:
                continue
            if samples:
                seq.num_pending_tokens -= 1
                seq.token_ids.append(token)
            self.block_manager.cache_full_blocks(seq)
            if not samples:
                continue
            if seq.first_token_time is None:
                seq.first_token_time = self.clock()
            advanced.append(seq)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self._dequeue(seq)
                self.finish(seq, reason)
        return advanced

    def update_verified(self, batch: ScheduledBatch, runs: list[list[int]]) -> list[tuple[Sequence, int]]:
        """Append each sequence's verified run (its accepted drafts, then the target's token),
        cut after the first token that stops it. Returns (sequence, tokens appended) for those
        that got tokens; the KV of the appended tokens but the last is the verify step's."""
        advanced = []
        for seq, start, run in zip(batch.seqs, batch.num_computed_tokens, runs):
            if seq.is_finished:
                continue
            seq.num_pending_tokens -= 1
            seq.num_computed_tokens = start + len(run)    # the newest token and the accepted drafts
            reason, appended = None, 0
            for token in run:
                seq.token_ids.append(token)
                appended += 1
                reason = self._stop_reason(seq, token)
                if reason is not None:
                    break
            self.block_manager.cache_full_blocks(seq)
            advanced.append((seq, appended))
            if reason is not None:
                self._dequeue(seq)
                self.finish(seq, reason)
        return advanced

    def _dequeue(self, seq: Sequence) -> None:
        """Off its queue: running, or waiting when it was preempted while its last token was pending."""
        queue = self.running if seq.request_id in self.running else self.waiting
        queue.remove(seq)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        """"stop" on an EOS or a stop token (then recorded as the sequence's stop_token_id: its text is left out of
        the output, as vLLM leaves it out), "length" at its length, else None."""
        params = seq.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in seq.eos_token_ids):
            seq.stop_token_id = token
            return "stop"
        if seq.num_pending_tokens == 0 and self._reached_length(seq):
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        self._free_blocks(seq)
        seq.draft_token_ids = []
        seq.num_pending_tokens = 0            # tokens of steps launched after its stop are never read
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = self.clock()

    def _free_blocks(self, seq: Sequence) -> None:
        if seq.block_table:
            self._freed.append(seq)
        self.block_manager.free(seq)
