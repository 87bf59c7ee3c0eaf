"""Factories for the engine's core: sequences, schedulers and an engine core over a fake model runner.

They take the same arguments as the real constructors (with small defaults: blocks of 4 tokens, a
pool of 64 blocks), so a test states only what it is about. The fake runner computes nothing: it
samples scripted tokens and scores prompts position by position, as `ModelRunner.run` reports them.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

import pytest

from atom_aot.runtime.engine.engine_core import EngineCore
from atom_aot.runtime.outputs import StepOutput, TokenLogprobs
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.scheduling.block_manager import BlockManager
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.scheduling.scheduler import Scheduler, SchedulerConfig, SpeculationShape
from atom_aot.runtime.scheduling.sequence import Sequence

BLOCK_SIZE = 4
EOS = 2
FILLER = 100   # the fake runner's token when nothing is scripted: never a stop token


class FakeClock:
    """A time source the test moves by hand."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_seq(tokens, request_id: str = "r", *, block_size: int = BLOCK_SIZE, arrival_time: float = 0.0,
             eos_token_ids=frozenset({EOS}), **params) -> Sequence:
    """A new request; `params` are SamplingParams fields."""
    tokens = list(tokens)
    return Sequence(request_id=request_id, token_ids=tokens, num_prompt_tokens=len(tokens),
                    params=SamplingParams(**params), block_size=block_size,
                    eos_token_ids=frozenset(eos_token_ids), arrival_time=arrival_time)


def make_scheduler(num_blocks: int = 64, *, block_size: int = BLOCK_SIZE, max_num_seqs: int = 8,
                   max_num_batched_tokens: int = 64, max_model_len: int = 64, scheduler_delay_factor: float = 0.0,
                   enable_prefix_caching: bool = True, clock: Callable[[], float] | None = None,
                   scheduling_policy: str = "fcfs", speculation: SpeculationShape | None = None) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                             max_model_len=max_model_len, scheduler_delay_factor=scheduler_delay_factor,
                             scheduling_policy=scheduling_policy, speculation=speculation)
    return Scheduler(config, BlockManager(num_blocks, block_size, enable_prefix_caching), clock=clock or FakeClock())


@dataclass(frozen=True)
class StepRecord:
    """What one batch held when it ran (sequences change after the step; this does not)."""
    request_ids: tuple[str, ...]
    num_new_tokens: tuple[int, ...]
    starts: tuple[int, ...]          # each sequence's num_computed_tokens before the step
    is_prefill: bool


class FakeSampler:
    def __init__(self):
        self.seeds: list[int] = []

    def new_request_generator(self, seed: int) -> random.Random:
        self.seeds.append(seed)
        return random.Random(seed)


class FakeRunner:
    """Stands in for `ModelRunner`: `script[request_id]` lists the tokens that request samples, in
    order (then FILLER); a sampled token's logprob is -1, a prompt position p scores -(p + 1).
    It computes a step when it is launched; `complete` hands that out."""

    def __init__(self, script: dict[str, list[int]] | None = None):
        self.script = {request_id: list(tokens) for request_id, tokens in (script or {}).items()}
        self.sampler = FakeSampler()
        self.steps: list[StepRecord] = []

    def run(self, batch: ScheduledBatch) -> StepOutput:
        return self.complete(self.launch(batch))

    def new_request_generator(self, seed: int) -> random.Random:
        return self.sampler.new_request_generator(seed)

    def launch(self, batch: ScheduledBatch) -> StepOutput:
        self.steps.append(StepRecord(tuple(s.request_id for s in batch.seqs), batch.num_new_tokens,
                                     batch.num_computed_tokens, batch.is_prefill))
        out = StepOutput(sampled=[], logprobs=[], prompt_logprobs=[])
        for seq, start, count, samples in zip(batch.seqs, batch.num_computed_tokens, batch.num_new_tokens,
                                              batch.sampling):
            token = self._next_token(seq, start + count) if samples else None
            out.sampled.append(token)
            out.logprobs.append(None if token is None or seq.params.logprobs is None
                                else TokenLogprobs(token, -1.0, 1, []))
            out.prompt_logprobs.append(self._score_prompt(seq, start, count))
        return out

    @staticmethod
    def complete(launched: StepOutput) -> StepOutput:
        return launched

    def _next_token(self, seq: Sequence, num_tokens: int) -> int:
        """The token sampled after the first `num_tokens` of `seq`."""
        tokens = self.script.get(seq.request_id, [])
        index = num_tokens - seq.num_prompt_tokens
        return tokens[index] if index < len(tokens) else FILLER

    @staticmethod
    def _score_prompt(seq: Sequence, start: int, count: int) -> list[TokenLogprobs] | None:
        """Like the real runner: positions in [start, start + count) that predict a prompt token."""
        if seq.params.prompt_logprobs is None:
            return None
        positions = range(start, min(start + count, seq.num_prompt_tokens - 1))
        return [TokenLogprobs(seq.token_ids[p + 1], -(p + 1.0), 1, []) for p in positions]


def run_step(scheduler: Scheduler, runner: FakeRunner) -> tuple[ScheduledBatch | None, list[Sequence]]:
    """One engine step without the engine core: schedule, run, update. Returns (batch, advanced)."""
    batch = scheduler.schedule()
    if batch is None:
        return None, []
    return batch, scheduler.update(batch, runner.run(batch).sampled)


def make_core(num_blocks: int = 64, *, runner: FakeRunner | None = None, eos_token_ids=frozenset({EOS}),
              block_size: int = BLOCK_SIZE, clock: Callable[[], float] = time.perf_counter,
              async_scheduling: bool = False, vocab_size: int | None = None, **scheduler_options) -> EngineCore:
    """An engine core over `make_scheduler(num_blocks, **scheduler_options)` and a fake runner.
    The clock is the real one by default: the engine core stamps arrivals with time.perf_counter."""
    scheduler = make_scheduler(num_blocks, block_size=block_size, clock=clock, **scheduler_options)
    return EngineCore(scheduler, runner or FakeRunner(), frozenset(eos_token_ids), block_size, async_scheduling,
                      vocab_size=vocab_size)


def run_to_end(core: EngineCore, max_steps: int = 200) -> list:
    """Every output of every step until nothing is left."""
    outputs = []
    for _ in range(max_steps):
        if not core.has_unfinished():
            return outputs
        outputs.extend(core.step())
    pytest.fail(f"not finished after {max_steps} steps")


def poison_kv_cache(monkeypatch) -> None:
    """Every KV cache an engine of this process allocates from now on starts as NaN, so that attention reading a
    slot no step wrote (the CPU pool is left uninitialized: it may hold anything) changes the output every time,
    not only when the allocator hands back memory that happens to hold a NaN."""
    from atom_aot.runtime.execution import model_setup
    allocate = model_setup.allocate_kv_cache
    monkeypatch.setattr(model_setup, "allocate_kv_cache",
                        lambda spec, num_blocks, block_size, device:
                        allocate(spec, num_blocks, block_size, device).fill_(float("nan")))
