"""Prefill-first continuous batching over the paged KV cache.

Each step is either a prefill step (new prompts, and chunks of prompts longer than the token
budget) or a decode step (one token for every running sequence). When decode runs out of blocks
the youngest running sequence is preempted: its blocks are freed and it is recomputed later from
its tokens (prompt plus what it generated), so preemption never loses output.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from atom_aot.runtime.block_manager import BlockManager
from atom_aot.runtime.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256            # sequences in one batch
    max_num_batched_tokens: int = 8192  # tokens computed in one step; longer prompts are chunked
    max_model_len: int = 4096          # prompt + output tokens of one sequence
    scheduler_delay_factor: float = 0.0  # wait this many last-prefill latencies to gather prompts

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.scheduler_delay_factor < 0:
            raise ValueError(f"scheduler_delay_factor must be >= 0, got {self.scheduler_delay_factor}")


@dataclass(frozen=True)
class ScheduledBatch:
    """The scheduler's decision for one step: what the model runner computes."""
    seqs: tuple[Sequence, ...]        # in batch order
    num_new_tokens: tuple[int, ...]   # tokens each sequence computes, from its num_computed_tokens
    is_prefill: bool                  # False: every sequence computes exactly its one newest token

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def samples(self, index: int) -> bool:
        """Whether sequence `index` reaches its last token this step, so a next token is sampled."""
        seq = self.seqs[index]
        return seq.num_computed_tokens + self.num_new_tokens[index] == seq.num_tokens


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._last_prefill_time = 0.0
        self._last_prefill_latency = 0.0
        self._prefill_pending_timing = False

    # -- intake -----------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def abort(self, request_id: str, reason: str = "abort") -> Sequence | None:
        """Finish a request early (a client went away, or a stop string matched)."""
        for queue in (self.waiting, self.running):
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    self.finish(seq, reason)
                    return seq
        return None

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- scheduling -------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch | None:
        now = time.perf_counter()
        if self._prefill_pending_timing:
            self._last_prefill_latency = now - self._last_prefill_time
            self._prefill_pending_timing = False
        if self._partial_prefills() or (self.waiting and self._delay_passed(now)):
            batch = self._schedule_prefill()
            if batch is not None:
                self._last_prefill_time, self._prefill_pending_timing = now, True
                return batch
        return self._schedule_decode()

    def _partial_prefills(self) -> list[Sequence]:
        return [seq for seq in self.running if seq.num_uncomputed_tokens > 1]

    def _delay_passed(self, now: float) -> bool:
        """vLLM's delay factor: hold new prompts back a little to batch them, never when idle."""
        if self.config.scheduler_delay_factor <= 0 or not self.running:
            return True
        oldest = min(seq.arrival_time for seq in self.waiting)
        return now - oldest > self.config.scheduler_delay_factor * self._last_prefill_latency

    def _schedule_prefill(self) -> ScheduledBatch | None:
        budget = self.config.max_num_batched_tokens
        seqs, counts = [], []
        for seq in self._partial_prefills():
            count = min(seq.num_uncomputed_tokens, budget)
            if count == 0:
                break
            if seq.status != SequenceStatus.RUNNING:   # preempted to make room for an older one
                continue
            if self._reserve(seq, count, seqs):
                seqs.append(seq), counts.append(count)
                budget -= count
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            # a prompt scored token by token (prompt logprobs) cannot skip cached tokens
            cached = [] if seq.params.prompt_logprobs is not None else self.block_manager.find_cached_prefix(seq)
            count = min(seq.num_tokens - len(cached) * self.block_manager.block_size, budget)
            if not self.block_manager.can_allocate_with_prefix(seq, cached, count):
                break                                   # waiting sequences hold no blocks
            self.block_manager.allocate_prefix(seq, cached)
            self.block_manager.allocate(seq, count)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            seqs.append(seq), counts.append(count)
            budget -= count
        if not seqs:
            return None
        return ScheduledBatch(tuple(seqs), tuple(counts), is_prefill=True)

    def _schedule_decode(self) -> ScheduledBatch | None:
        scheduled: list[Sequence] = []
        for seq in list(self.running):
            if seq.status != SequenceStatus.RUNNING or seq.num_uncomputed_tokens != 1:
                continue                          # preempted meanwhile, or still in its prefill
            if self._reserve(seq, 1, scheduled):
                scheduled.append(seq)
        if not scheduled:
            return None
        return ScheduledBatch(tuple(scheduled), (1,) * len(scheduled), is_prefill=False)

    def _reserve(self, seq: Sequence, count: int, scheduled: list[Sequence]) -> bool:
        """Allocate slots for `count` tokens of a running sequence, preempting the youngest
        unscheduled sequences until they fit. False if `seq` itself had to be preempted."""
        while not self.block_manager.can_allocate(seq, count):
            victim = next(s for s in reversed(self.running) if not any(s is t for t in scheduled))
            self._preempt(victim)
            if victim is seq:
                return False
        self.block_manager.allocate(seq, count)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # -- after the step ---------------------------------------------------------------------
    def update(self, batch: ScheduledBatch, sampled: list[int | None]) -> list[Sequence]:
        """Advance each sequence by what was computed, append sampled tokens, finish what stops.

        Returns the sequences that got a new token this step.
        """
        advanced = []
        for seq, count, token in zip(batch.seqs, batch.num_new_tokens, sampled):
            if seq.is_finished:          # aborted while the step ran
                continue
            seq.num_computed_tokens += count
            self.block_manager.cache_full_blocks(seq)
            if token is None:
                continue
            seq.token_ids.append(token)
            if seq.first_token_time is None:
                seq.first_token_time = time.perf_counter()
            advanced.append(seq)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.running.remove(seq)
                self.finish(seq, reason)
        return advanced

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in seq.eos_token_ids):
            return "stop"
        if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
            return "length"
        if seq.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = time.perf_counter()
