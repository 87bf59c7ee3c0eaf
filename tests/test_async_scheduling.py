"""Async scheduling: batch N+1 is scheduled and launched before batch N's tokens are read.

The scheduler's pending-token accounting (plain Python, fake runner), the engine core's one-step
lag, and the same outputs with it on and off: over a fake runner with scripted stops, over the
real model runner with a fake forward (pending decode inputs gathered from the previous step's
sampled tokens), and over tiny models end to end (eager and AOT artifacts).
"""
from __future__ import annotations

import random

import pytest

from atom_aot import LLMEngine, SamplingParams
from atom_aot.runtime.engine.engine_core import EngineCore
from atom_aot.runtime.execution.forwards import Forwards
from atom_aot.runtime.scheduling.sequence import SequenceStatus
from engine_factories import EOS, FILLER, FakeRunner, make_core, make_scheduler, make_seq, run_to_end
from factories import random_prompts
from runner_factories import RecordingForward, make_batch, make_runner, make_sequence


def pool_is_whole(block_manager) -> bool:
    return block_manager.num_free_blocks == block_manager.num_blocks


class TestPendingTokens:
    """The scheduler advances a batch's counts when it makes it; `update` fills the tokens in."""

    def test_the_next_decode_is_scheduled_before_the_token_is_read(self):
        scheduler = make_scheduler()
        seq = make_seq(range(10, 15))
        scheduler.add(seq)
        prefill = scheduler.schedule()
        assert (prefill.num_computed_tokens, prefill.sampling) == ((0,), (True,))
        assert (seq.num_computed_tokens, seq.num_pending_tokens, seq.num_tokens) == (5, 1, 6)
        decode = scheduler.schedule()
        assert not decode.is_prefill and decode.seqs == (seq,) and decode.num_computed_tokens == (5,)
        assert (seq.num_computed_tokens, seq.num_pending_tokens, seq.token_ids) == (6, 2, list(range(10, 15)))
        assert scheduler.update(prefill, [7]) == [seq] and seq.num_pending_tokens == 1
        scheduler.update(decode, [8])
        assert seq.output_token_ids == [7, 8] and seq.num_pending_tokens == 0

    @pytest.mark.parametrize("limits, prompt_len, num_output", [
        (dict(max_tokens=2), 5, 2),
        (dict(max_tokens=None, max_model_len=8), 6, 2),
    ])
    def test_length_stops_are_never_scheduled_past(self, limits, prompt_len, num_output):
        max_model_len = limits.pop("max_model_len", 64)
        scheduler = make_scheduler(max_model_len=max_model_len)
        seq = make_seq(range(10, 10 + prompt_len), **limits)
        scheduler.add(seq)
        batches = [scheduler.schedule() for _ in range(num_output)]
        assert scheduler.schedule() is None and seq.num_output_tokens == num_output
        for i, batch in enumerate(batches):
            scheduler.update(batch, [FILLER + i])
        assert seq.finish_reason == "length" and seq.output_token_ids == [FILLER, FILLER + 1]
        assert pool_is_whole(scheduler.block_manager)

    def test_a_stop_token_is_seen_one_step_late_and_the_extra_result_dropped(self):
        scheduler = make_scheduler()
        seq = make_seq(range(10, 15), max_tokens=5)
        scheduler.add(seq)
        prefill, extra = scheduler.schedule(), scheduler.schedule()
        assert extra.seqs == (seq,)
        assert scheduler.update(prefill, [EOS]) == [seq] and seq.finish_reason == "stop"
        assert pool_is_whole(scheduler.block_manager)        # freed while `extra` may still run: one stream
        assert scheduler.update(extra, [9]) == []
        assert seq.output_token_ids == [EOS] and seq.num_tokens == 6 and not scheduler.has_unfinished()
        assert scheduler.schedule() is None

    def test_a_sequence_preempted_while_its_token_is_pending_waits_for_it(self):
        scheduler = make_scheduler(3, enable_prefix_caching=False)
        a, b = make_seq(range(10, 14), "a"), make_seq(range(20, 24), "b")
        scheduler.add(a), scheduler.add(b)
        prefill = scheduler.schedule()                   # one block each, both sample: one block free
        decode = scheduler.schedule()                    # both need a block: b gives way, its token pending
        assert decode.seqs == (a,) and b.status == SequenceStatus.WAITING and b.num_pending_tokens == 1
        assert decode.freed == (b,)                      # the runner releases b's row
        nxt = scheduler.schedule()
        assert nxt.seqs == (a,) and not nxt.is_prefill   # b is not recomputed before its token is known
        scheduler.update(prefill, [7, 8])
        assert b.output_token_ids == [8] and b.num_pending_tokens == 0 and b.status == SequenceStatus.WAITING
        scheduler.abort("a")
        scheduler.update(decode, [9]), scheduler.update(nxt, [9])
        readmitted = scheduler.schedule()
        assert readmitted.is_prefill and readmitted.seqs == (b,) and readmitted.num_new_tokens == (5,)

    def test_a_preempted_sequence_whose_pending_token_stops_it_finishes_from_the_waiting_queue(self):
        scheduler = make_scheduler(3, enable_prefix_caching=False)
        a, b = make_seq(range(10, 14), "a"), make_seq(range(20, 24), "b")
        scheduler.add(a), scheduler.add(b)
        prefill = scheduler.schedule()
        scheduler.schedule()                             # b preempted with its token pending
        scheduler.update(prefill, [7, EOS])
        assert b.finish_reason == "stop" and "b" not in scheduler.waiting and b.output_token_ids == [EOS]

    def test_a_block_holding_a_pending_token_is_not_cached_until_the_token_is_read(self):
        scheduler = make_scheduler()
        seq = make_seq(range(10, 13))                    # 3 prompt tokens: the first output ends block 0
        scheduler.add(seq)
        prefill = scheduler.schedule()
        scheduler.schedule()                             # computes position 3: block 0 is computed, not known
        bm = scheduler.block_manager
        bm.cache_full_blocks(seq)
        assert seq.block_hashes == [] and not bm.hash_to_block
        scheduler.update(prefill, [7])
        assert len(seq.block_hashes) == 1 and bm.blocks[seq.block_table[0]].token_ids == [10, 11, 12, 7]


class TestEngineCoreLag:
    """Over a fake runner: a step returns the outputs of the batch launched by the step before."""

    def test_outputs_come_one_step_after_their_batch(self):
        core = make_core(async_scheduling=True)
        core.add_request([5, 6, 7], SamplingParams(max_tokens=3), request_id="r")
        assert core.step() == []                                   # the prefill is launched, not read
        assert [o.new_token_ids for o in core.step()] == [[FILLER]]
        assert [o.new_token_ids for o in core.step()] == [[FILLER]]
        last = core.step()                                         # nothing left to schedule: read the last
        assert [(o.new_token_ids, o.finish_reason) for o in last] == [([FILLER], "length")]
        assert not core.has_unfinished() and len(core.runner.steps) == 3 and pool_is_whole(core.block_manager)

    def test_a_stop_token_seen_late_is_not_returned(self):
        core = make_core(async_scheduling=True, runner=FakeRunner({"r": [9, EOS]}))
        core.add_request([5, 6, 7], SamplingParams(max_tokens=5), request_id="r")
        outputs = run_to_end(core)
        assert [(o.new_token_ids, o.finish_reason) for o in outputs] == [([9], None), ([EOS], "stop")]
        assert len(core.runner.steps) == 3                         # prefill, two decodes: the second dropped
        assert pool_is_whole(core.block_manager)

    def test_an_abort_while_a_step_is_in_flight(self):
        core = make_core(async_scheduling=True)
        core.add_request([5, 6, 7], SamplingParams(max_tokens=8), request_id="r")
        core.step(), core.step()
        core.abort("r")
        assert core.has_unfinished()                               # a launched step is still to be read
        assert core.step() == [] and not core.has_unfinished() and pool_is_whole(core.block_manager)


def scripted_workload(seed: int, async_scheduling: bool) -> tuple[EngineCore, dict]:
    """A small pool, budget and batch cap; prompts long enough to be chunked and preempted; outputs
    that stop on EOS or stop tokens at scripted places."""
    rng = random.Random(seed)
    max_model_len = rng.choice([16, 24, 32])
    script = {}
    core = make_core(rng.randint(max_model_len // 4, max_model_len // 4 + 6), max_model_len=max_model_len,
                     max_num_batched_tokens=rng.randint(1, 20), max_num_seqs=rng.randint(1, 6),
                     enable_prefix_caching=rng.random() < 0.5, async_scheduling=async_scheduling,
                     runner=FakeRunner(script))
    for i in range(rng.randint(1, 10)):
        prompt = [rng.randrange(3, 8) for _ in range(rng.randint(1, max_model_len - 2))]
        script[str(i)] = [rng.choice([EOS, 9, 11, 12, 13]) for _ in range(max_model_len)]
        params = SamplingParams(max_tokens=rng.choice([None, rng.randint(1, max_model_len - len(prompt))]),
                                stop_token_ids=rng.choice([[], [9]]), ignore_eos=rng.random() < 0.3,
                                prompt_logprobs=rng.choice([0, None]), logprobs=rng.choice([0, None]))
        core.add_request(prompt, params, request_id=str(i))
    core.runner.script.update(script)
    return core, script


def outputs_by_request(core) -> dict:
    """request id -> [(token, finish reason, logprob, prompt logprobs)] over the whole run."""
    got: dict[str, list] = {}
    for o in run_to_end(core, max_steps=2000):
        prompt = None if o.prompt_logprobs is None else [lp.logprob for lp in o.prompt_logprobs]
        got.setdefault(o.request_id, []).append((o.new_token_ids, o.finish_reason,
                                                 [lp.logprob for lp in o.logprobs], prompt))
    return got


@pytest.mark.parametrize("seeds", [range(0, 75), range(75, 150)])
def test_scripted_workloads_give_the_same_outputs_either_way(seeds):
    for seed in seeds:
        sync, _ = scripted_workload(seed, async_scheduling=False)
        overlapped, _ = scripted_workload(seed, async_scheduling=True)
        assert outputs_by_request(overlapped) == outputs_by_request(sync), seed
        assert pool_is_whole(sync.block_manager) and pool_is_whole(overlapped.block_manager), seed


class TestRealRunner:
    """The model runner on the CPU with a fake forward whose next token is (input token + 1) % 32:
    a decode input gathered wrong from the previous step's samples breaks the chain."""

    def core(self, async_scheduling: bool, num_blocks: int = 16) -> EngineCore:
        runner = make_runner(Forwards(RecordingForward(), RecordingForward()), num_blocks=num_blocks)
        scheduler = make_scheduler(num_blocks, max_model_len=40, max_num_batched_tokens=12)
        return EngineCore(scheduler, runner, frozenset({EOS}), 4, async_scheduling)

    def generate(self, core, prompts, **params) -> dict[str, list[int]]:
        for i, prompt in enumerate(prompts):
            core.add_request(prompt, SamplingParams(temperature=0, **params), request_id=str(i))
        tokens: dict[str, list[int]] = {}
        for o in run_to_end(core):
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        return tokens

    def test_pending_inputs_are_gathered_from_the_previous_steps_samples(self):
        prompts = [[3, 4, 5], list(range(10, 25)), [30, 31]]
        expected = {str(i): [(p[-1] + k) % 32 for k in range(1, 9)] for i, p in enumerate(prompts)}
        for async_scheduling in (False, True):
            core = self.core(async_scheduling)
            assert self.generate(core, prompts, max_tokens=8, ignore_eos=True) == expected, async_scheduling
            assert pool_is_whole(core.block_manager)
        decode_inputs = core.runner.forwards.decode.calls[1].input_ids.tolist()
        # read from the device; "0" decoded once already beside the last chunk of "1" (a mixed step)
        assert decode_inputs == [(prompts[0][-1] + 3) % 32] + [(p[-1] + 2) % 32 for p in prompts[1:]]

    def test_preemption_in_a_small_pool(self):
        prompts = [list(range(i, i + 7)) for i in range(3, 27, 6)]
        results = [self.generate(self.core(flag, num_blocks=10), prompts, max_tokens=9, ignore_eos=True)
                   for flag in (False, True)]
        assert results[0] == results[1]

    def test_a_pending_input_the_previous_step_did_not_sample_is_refused(self):
        runner = make_runner()
        seq = make_sequence([1, 2, 3], block_table=[0], num_computed_tokens=3)
        seq.num_pending_tokens = 1                        # its 4th token: sampled by no step of this runner
        with pytest.raises(RuntimeError, match="neither known nor sampled by the previous step"):
            runner.prepare_inputs(make_batch((seq, 1)))


# -- tiny models end to end -----------------------------------------------------------------
def both_ways(artifact, **config) -> tuple[LLMEngine, LLMEngine]:
    """(synchronous, async) engines on one artifact."""
    return tuple(LLMEngine(str(artifact), async_scheduling=flag, **config) for flag in (False, True))


def generate(engine, prompts, params) -> list[tuple]:
    """(token ids, text, finish reason) per prompt; the pool is whole afterwards."""
    outs = engine.generate(prompts, params)
    assert engine.is_finished() and pool_is_whole(engine.core.block_manager)
    return [(o["token_ids"], o["text"], o["finish_reason"]) for o in outs]


@pytest.fixture(scope="module")
def engines(tiny_llama_eager_artifact):
    return both_ways(tiny_llama_eager_artifact)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(10, 380, seed=11)


class TestTinyModel:
    def test_greedy_with_max_tokens(self, engines, prompts):
        params = [SamplingParams(temperature=0, max_tokens=8 + 5 * i) for i in range(len(prompts))]
        sync, overlapped = (generate(engine, prompts, params) for engine in engines)
        assert overlapped == sync

    def test_stop_tokens_and_stop_strings(self, engines, prompts):
        """A stop token ends a request as EOS does (tests/test_parity.py: EOS stops like transformers)."""
        free = generate(engines[0], prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
        stop_tokens = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[ids[10]])
                       for ids, _, _ in free]
        stop_strings = [SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_strings=[text[-8:-4]])
                        for _, text, _ in free if text[-8:-4].strip()]
        for params, chosen in ((stop_tokens, prompts), (stop_strings, prompts[:len(stop_strings)])):
            sync, overlapped = (generate(engine, chosen, params) for engine in engines)
            assert overlapped == sync
            assert all(reason == "stop" for _, _, reason in sync)

    def test_seeded_sampling(self, engines, prompts):
        params = [SamplingParams(temperature=1.0, top_k=40, max_tokens=16, seed=i) for i in range(len(prompts))]
        sync, overlapped = (generate(engine, prompts, params) for engine in engines)
        assert overlapped == sync

    def test_logprobs_and_prompt_logprobs(self, engines, prompts):
        params = SamplingParams(temperature=0, max_tokens=6, logprobs=2, prompt_logprobs=1)
        runs = []
        for engine in engines:
            index = {request_id: i for i, request_id in enumerate(engine.add_request(prompts[:4], params))}
            seen: dict[int, list] = {i: [] for i in index.values()}
            while not engine.is_finished():
                for update in engine.step():
                    i = index[update.request_id]
                    if update.prompt_logprobs is not None:
                        seen[i].append([(lp.token_id, lp.rank) for lp in update.prompt_logprobs])
                    seen[i] += [(lp.token_id, lp.rank, [t for t, _ in lp.top]) for lp in update.logprobs]
            runs.append(seen)
        assert runs[0] == runs[1]
        assert all(len(entries) == 1 + 6 for entries in runs[0].values())

    def test_prefix_caching(self, engines):
        shared = random_prompts(1, 380, seed=7, lengths=(40, 40))[0]
        prefixed = random_prompts(6, 380, seed=8, lengths=(1, 20), prefix=shared)
        params = SamplingParams(temperature=0, max_tokens=12)
        results = []
        for engine in engines:
            hits = engine.core.block_manager.prefix_hits
            results.append(generate(engine, prefixed[:1], params) + generate(engine, prefixed[1:], params))
            assert engine.core.block_manager.prefix_hits - hits >= 5 * (40 // 16)
        assert results[0] == results[1]

    def test_max_model_len(self, tiny_llama_eager_artifact, prompts):
        params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
        short = [p[:40] for p in prompts if len(p) >= 24]
        sync, overlapped = (generate(engine, short, params)
                            for engine in both_ways(tiny_llama_eager_artifact, max_model_len=48))
        assert overlapped == sync
        assert [len(ids) for ids, _, _ in sync] == [48 - len(p) for p in short]

    def test_preemption_and_chunked_prefill_in_a_tiny_pool(self, tiny_llama_eager_artifact, prompts):
        sync_engine, async_engine = both_ways(tiny_llama_eager_artifact, num_kv_blocks=12,
                                              max_num_batched_tokens=16, max_model_len=96)
        params = SamplingParams(temperature=0, max_tokens=24)
        assert generate(async_engine, prompts, params) == generate(sync_engine, prompts, params)
        assert sync_engine.core.scheduler.num_preemptions > 0 and async_engine.core.scheduler.num_preemptions > 0


def test_aot_artifact_gives_the_same_tokens_either_way(tiny_llama_artifact):
    """The compiled mixed and decode packages: pending decode inputs reach the decode package."""
    sync_engine, async_engine = both_ways(tiny_llama_artifact, num_kv_blocks=16, max_num_batched_tokens=32,
                                          max_model_len=96)
    prompts = random_prompts(8, 380, seed=12)
    params = [SamplingParams(temperature=0, max_tokens=10 + 3 * i) for i in range(len(prompts))]
    assert generate(async_engine, prompts, params) == generate(sync_engine, prompts, params)
    assert async_engine.core.scheduler.num_preemptions > 0
