"""The engine's inner loop at the level of token ids: intake -> schedule -> launch -> read -> update.

It knows nothing of text. The same class runs inside `LLMEngine` (offline) and inside the
server's engine process.

With async scheduling a step launches batch N+1 before it reads batch N's tokens, so the host's
work (scheduling, inputs, reading and updating N, and the caller's output processing of N) runs
while the device computes N+1. Without it, a step reads the batch it launched. A request whose logits depend on the values of its
last tokens on the host (a grammar, a bad word of several tokens: `SamplingParams.needs_last_tokens`)
makes the steps run synchronously while it is unfinished: its next step is launched only after its
last one is read. Speculative
decoding (a runner that verifies draft tokens, atom_aot/runtime/spec/) runs synchronously: after each step
the runner proposes the next drafts of the sequences that got tokens, and the core hands them to the scheduler.

A request with a grammar is not handed to the scheduler until its grammar compiled: it waits in a map of
compiling requests, polled each step, while a pool of worker processes compiles (grammar_compiler.py), so
one request's grammar never stalls the others' steps.
"""
from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Callable, Protocol

from atom_aot.errors import ContextLengthError, RequestError
from atom_aot.runtime.outputs import CoreOutput, CoreStats, SpecCounters, StepOutput, TokenLogprobs, VerifiedOutput
from atom_aot.runtime.sampling.structured_output import Grammars, accept_sampled
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.scheduling.block_manager import BlockManager
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.scheduling.scheduler import Scheduler
from atom_aot.runtime.scheduling.sequence import Sequence

log = logging.getLogger("atom_aot")

COMPILE_POLL_S = 0.05       # how long an engine with nothing but compiling requests waits for a compile per step
Admitted = Callable[[str | None], None]     # told once a request is queued (None) or refused (why)


class Runner(Protocol):
    """What the engine core needs of a model runner (runtime/execution/model_runner.py; the speculative one,
    runtime/spec/verifier.py): `launch` queues a batch's work on the device, `complete` reads its results."""

    def launch(self, batch: ScheduledBatch) -> object: ...

    def complete(self, launched) -> StepOutput | VerifiedOutput: ...

    def new_request_generator(self, seed: int):
        """A random generator of a request's own (its `seed`), on the runner's device."""

    def take_draft_token_ids(self, seqs: list[Sequence]) -> dict[str, list[int]]:
        """Speculative runners only: drafts for the next verify step of these sequences, after their step."""


class Pace(Protocol):
    """How a data-parallel-attention rank's loop steps with the others (runtime/parallel/attention_dp.py Lockstep)."""

    def agree(self, busy: bool, stop: bool) -> tuple[bool, bool]: ...

    def step(self, step: Callable[[], list], has_work: bool) -> list: ...


@dataclass(frozen=True)
class Compiling:
    """A request waiting for its grammar, out of the scheduler's sight."""
    seq: Sequence
    grammar: Future         # the CompiledGrammar (grammar_compiler.py)
    on_admitted: Admitted | None


def check_prompt(prompt_token_ids: list[int], params: SamplingParams, max_model_len: int,
                 vocab_size: int | None) -> None:
    """What any engine refuses of a prompt before queuing it: empty, a token outside the vocabulary, or more
    than the context holds with the tokens it asks for."""
    num_prompt_tokens = len(prompt_token_ids)
    if num_prompt_tokens == 0:
        raise RequestError("the prompt is empty")
    if vocab_size is not None:
        _check_token_ids(prompt_token_ids, params, vocab_size)
    wanted = num_prompt_tokens + (params.max_tokens or 1)
    if wanted > max_model_len:
        raise ContextLengthError(
            f"this model's maximum context length is {max_model_len} tokens, but the request needs "
            f"{wanted} ({num_prompt_tokens} in the prompt + {params.max_tokens or 1} to generate)")


def _check_token_ids(prompt_token_ids: list[int], params: SamplingParams, vocab_size: int) -> None:
    """Every token id the request names lies in the vocabulary: the sampler indexes logits rows with them."""
    named = {"prompt": prompt_token_ids, "stop_token_ids:": params.stop_token_ids,
             "logit_bias:": list(params.logit_bias), "allowed_token_ids:": params.allowed_token_ids or [],
             "bad_words_token_ids:": [t for word in params.bad_words_token_ids for t in word]}
    for label, ids in named.items():
        bad = next((t for t in ids if t >= vocab_size), None)
        if bad is not None:
            raise RequestError(f"{label} token id {bad} is outside the model's vocabulary (0..{vocab_size - 1})")


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: Runner, eos_token_ids: frozenset[int], block_size: int,
                 async_scheduling: bool = False, grammars: Grammars | None = None,
                 on_close: Callable[[], None] = lambda: None, spec_counters: SpecCounters | None = None,
                 lockstep: Pace | None = None, vocab_size: int | None = None):
        """`on_close`: what `close` releases besides this object (the other tensor-parallel ranks).
        `vocab_size`: the model's embedding rows; a prompt token at or above it is refused (on a GPU the
        embedding lookup would fault and take the engine down; a tokenizer can hold more ids than the model).
        `lockstep`: this engine is one rank of a data-parallel-attention artifact, whose loop must step
        with the other ranks (runtime/parallel/attention_dp.py; the server's engine loop does)."""
        self.scheduler = scheduler
        self.lockstep = lockstep
        self.on_close = on_close
        self.runner = runner
        self.eos_token_ids = eos_token_ids
        self.block_size = block_size
        self.async_scheduling = async_scheduling and spec_counters is None
        self.spec_counters = spec_counters      # speculative decoding's acceptance, when it runs
        self.vocab_size = vocab_size
        self._in_flight: deque[tuple[ScheduledBatch, object]] = deque()   # launched, not read yet
        self._ids = itertools.count()
        self._prompt_logprobs: dict[str, list[TokenLogprobs]] = {}
        self.grammars = grammars                   # None: structured outputs are refused
        self._host_bound: dict[Sequence, None] = {}  # unfinished requests that need synchronous steps
        self._compiling: dict[str, Compiling] = {}   # request id -> a request whose grammar is compiling
        self.num_prompt_tokens_total = 0
        self.num_generation_tokens_total = 0
        self.num_synchronous_steps = 0             # steps run without overlap because of such requests

    @property
    def block_manager(self) -> BlockManager:
        return self.scheduler.block_manager

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    arrival_time: float | None = None, on_admitted: Admitted | None = None) -> str:
        """Check a request (`check`), then queue it (`add_checked`)."""
        self.check(prompt_token_ids, params)
        return self.add_checked(prompt_token_ids, params, request_id, arrival_time, on_admitted)

    def add_checked(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None,
                    arrival_time: float | None = None, on_admitted: Admitted | None = None) -> str:
        """Queue a request that `check` (or `validate`) passed: callers that take several requests all or none
        check every one first, then queue each, so each is checked once. One whose grammar is not compiled yet
        waits for it (the engine steps meanwhile). `on_admitted` is told once, for every request: None when it is
        queued, or why it was refused (its grammar does not compile). Without it, a grammar already known not to
        compile raises RequestError."""
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self._compiling:
            raise RequestError(f"request id {request_id!r} is already in the engine; give each request its own id")
        seq = Sequence(request_id=request_id, token_ids=list(prompt_token_ids),
                       num_prompt_tokens=len(prompt_token_ids), params=params, block_size=self.block_size,
                       eos_token_ids=self.eos_token_ids, arrival_time=arrival_time or time.perf_counter())
        if params.seed is not None:
            seq.generator = self.runner.new_request_generator(params.seed)
        if params.grammar is None:
            self._queue(seq)
            if on_admitted is not None:
                on_admitted(None)
            return request_id
        waiting = Compiling(seq, self.grammars.request(params.grammar), on_admitted)
        if waiting.grammar.done() and on_admitted is None:
            self._queue(seq, waiting.grammar.result())          # raises the RequestError of one that failed
        elif waiting.grammar.done():
            self._admit(waiting)
        else:
            self._compiling[request_id] = waiting
        return request_id

    def _queue(self, seq: Sequence, compiled_grammar=None) -> None:
        if compiled_grammar is not None:
            seq.grammar_matcher = self.grammars.matcher(compiled_grammar)
        self.scheduler.add(seq)
        if seq.params.needs_last_tokens:
            self._host_bound[seq] = None
        if seq.params.prompt_logprobs is not None:
            self._prompt_logprobs[seq.request_id] = []
        self.num_prompt_tokens_total += seq.num_prompt_tokens

    def check(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """What is refused at once, before queuing: the prompt, what this engine cannot do. A grammar is not
        compiled here (`validate` waits for that)."""
        check_prompt(prompt_token_ids, params, self.scheduler.config.max_model_len, self.vocab_size)
        if params.priority != 0 and self.scheduler.config.scheduling_policy == "fcfs":
            raise RequestError(f"priority {params.priority} needs the priority scheduling policy; this engine "
                               f"serves first come, first served (start it with --scheduling-policy priority)")
        if self.spec_counters is not None and params.processes_logits:
            raise RequestError("penalties, logit_bias, min_tokens, bad_words, allowed_token_ids and structured "
                               "outputs are not supported with speculative decoding yet: serve without --method for "
                               "these requests")
        if params.grammar is not None and self.grammars is None:
            raise RequestError("structured outputs are not available in this engine (no tokenizer for a grammar)")

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """`check`, and the request's grammar compiled, waiting for it (the offline engine refuses a grammar
        that does not compile before it queues any request of a call; the compiled grammar is cached)."""
        self.check(prompt_token_ids, params)
        if params.grammar is not None:
            self.grammars.compiled(params.grammar)

    def abort(self, request_id: str, reason: str = "abort") -> None:
        self._prompt_logprobs.pop(request_id, None)
        waiting = self._compiling.pop(request_id, None)
        if waiting is not None and waiting.on_admitted is not None:
            waiting.on_admitted("the request was aborted while its grammar compiled")
        self.scheduler.abort(request_id, reason)

    def close(self) -> None:
        if self.grammars is not None:
            self.grammars.close()
        self.on_close()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._in_flight) or bool(self._compiling)

    def stats(self) -> CoreStats:
        bm = self.block_manager
        return CoreStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            kv_blocks_total=bm.num_blocks, kv_blocks_free=bm.num_free_blocks, prefix_cache_queries=bm.prefix_queries,
            prefix_cache_hits=bm.prefix_hits, num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens_total=self.num_prompt_tokens_total,
            generation_tokens_total=self.num_generation_tokens_total,
            synchronous_steps_total=self.num_synchronous_steps,
            spec=self.spec_counters.snapshot() if self.spec_counters is not None else None)

    def step(self) -> list[CoreOutput]:
        """Schedule and launch a batch; return the outputs of the one before it (async scheduling),
        or of this one. When nothing more can be scheduled the batch in flight is read."""
        outputs = self._admit_compiled()
        overlap = self.async_scheduling and not self._needs_synchronous_step()
        while self._in_flight and not overlap:      # the next step's logits need these tokens read
            outputs += self._complete(*self._in_flight.popleft())
        batch = self.scheduler.schedule()
        if batch is not None:
            self._in_flight.append((batch, self.runner.launch(batch)))
            self.num_synchronous_steps += self.async_scheduling and not overlap
        keep = 1 if overlap and batch is not None else 0
        while len(self._in_flight) > keep:
            outputs += self._complete(*self._in_flight.popleft())
        if batch is None and not self._in_flight and self._compiling:     # nothing to do but wait for grammars
            wait([waiting.grammar for waiting in self._compiling.values()], COMPILE_POLL_S, FIRST_COMPLETED)
        return outputs

    def _admit_compiled(self) -> list[CoreOutput]:
        """Queue the requests whose grammar compiled; the outputs of those refused that no one is told of."""
        done = [waiting for waiting in self._compiling.values() if waiting.grammar.done()]
        outputs = []
        for waiting in done:
            del self._compiling[waiting.seq.request_id]
            error = self._admit(waiting)
            if error is not None and waiting.on_admitted is None:
                log.error("request %r ends unstarted (finish_reason 'abort'): %s", waiting.seq.request_id, error)
                outputs.append(CoreOutput(request_id=waiting.seq.request_id, new_token_ids=[], finish_reason="abort",
                                          num_prompt_tokens=waiting.seq.num_prompt_tokens,
                                          arrival_time=waiting.seq.arrival_time, finish_time=time.perf_counter()))
        return outputs

    def _admit(self, waiting: Compiling) -> str | None:
        """Queue a request whose grammar is done compiling; None, or why it was refused (told to its caller)."""
        try:
            self._queue(waiting.seq, waiting.grammar.result())
            error = None
        except RequestError as e:
            error = str(e)
        except Exception:          # a bug in one request must not take the engine's loop down
            log.exception("request %r could not be queued", waiting.seq.request_id)
            error = "the request could not be queued (see the server's log)"
        if waiting.on_admitted is not None:
            waiting.on_admitted(error)
        return error

    def _needs_synchronous_step(self) -> bool:
        for seq in [seq for seq in self._host_bound if seq.is_finished]:
            del self._host_bound[seq]
        return bool(self._host_bound)

    def _complete(self, batch: ScheduledBatch, launched) -> list[CoreOutput]:
        result = self.runner.complete(launched)
        if batch.is_verify:
            return self._complete_verified(batch, result)
        self._collect_prompt_logprobs(batch, result.prompt_logprobs)
        advanced = self.scheduler.update(batch, result.sampled)
        self.num_generation_tokens_total += len(advanced)
        for seq in advanced:
            if seq.grammar_matcher is not None:
                self._advance_grammar(seq)
        self._take_drafts(advanced)
        logprobs = {seq.request_id: [lp] if lp is not None else [] for seq, lp in zip(batch.seqs, result.logprobs)}
        return [self._output(seq, logprobs[seq.request_id]) for seq in advanced]

    def _advance_grammar(self, seq: Sequence) -> None:
        """The grammar takes the token; one that ended it (its stop token) ends the request."""
        if seq.is_finished:
            return                      # on a stop token or at its length: nothing more is sampled
        if not accept_sampled(seq.grammar_matcher, seq.token_ids[-1], seq.request_id):
            self.scheduler.abort(seq.request_id, "abort")
        elif seq.grammar_matcher.is_terminated():
            self.scheduler.abort(seq.request_id, "stop")

    def _complete_verified(self, batch: ScheduledBatch, result: VerifiedOutput) -> list[CoreOutput]:
        """A verify step: each sequence's run of tokens (see SpeculativeRunner), cut at its first stop."""
        logprobs = {seq.request_id: lp for seq, lp in zip(batch.seqs, result.logprobs)}
        outputs, advanced = [], self.scheduler.update_verified(batch, result.runs)
        for seq, count in advanced:
            self.num_generation_tokens_total += count
            outputs.append(self._output(seq, (logprobs[seq.request_id] or [])[:count], count))
        self._take_drafts([seq for seq, _ in advanced])
        return outputs

    def _take_drafts(self, advanced: list[Sequence]) -> None:
        """Speculative decoding: the runner's drafts for the sequences that just got tokens, to the scheduler."""
        if self.spec_counters is not None:
            self.scheduler.update_draft_token_ids(self.runner.take_draft_token_ids(advanced))

    def _collect_prompt_logprobs(self, batch: ScheduledBatch, prompt_logprobs) -> None:
        for seq, start, scored in zip(batch.seqs, batch.num_computed_tokens, prompt_logprobs):
            collected = self._prompt_logprobs.get(seq.request_id)
            if scored is None or collected is None:
                continue
            # `scored` covers positions start.. ; a prompt recomputed after preemption is kept once
            seen = len(collected) - start
            if seen < 0:
                raise RuntimeError(f"prompt logprobs of request {seq.request_id!r} from position {start} arrived "
                                   f"before those of positions {len(collected)}..{start - 1}")
            collected.extend(scored[seen:])

    def _output(self, seq: Sequence, logprobs: list[TokenLogprobs], num_new: int = 1) -> CoreOutput:
        """Its `num_new` newest tokens (one, or a verified run)."""
        first = len(seq.token_ids) - num_new == seq.num_prompt_tokens
        return CoreOutput(
            request_id=seq.request_id, new_token_ids=seq.token_ids[-num_new:], finish_reason=seq.finish_reason,
            stop_token_id=seq.stop_token_id if seq.is_finished else None, logprobs=logprobs,
            prompt_logprobs=self._prompt_logprobs.pop(seq.request_id, None) if first else None,
            num_prompt_tokens=seq.num_prompt_tokens, num_cached_tokens=seq.num_cached_tokens,
            arrival_time=seq.arrival_time, first_token_time=seq.first_token_time, finish_time=seq.finish_time)
