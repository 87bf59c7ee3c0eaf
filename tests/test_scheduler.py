"""Scheduler: mixed steps (decodes first, then prompts), the token budget, preemption, the delay factor,
aborts, stops.

Plain Python with a fake runner (tests/engine_factories.py): blocks of 4 tokens.
"""
import time

import pytest

from atom_aot.errors import RequestError
from atom_aot.runtime.config import (DEFAULT_STEP_TOKENS_CPU, DEFAULT_STEP_TOKENS_GPU, DEFAULT_STEP_TOKENS_GPU_OFFLINE,
                                     RuntimeConfig)
from atom_aot.runtime.scheduling.scheduler import SchedulerConfig, SequenceQueue
from atom_aot.runtime.scheduling.sequence import SequenceStatus
from engine_factories import EOS, FILLER, FakeClock, FakeRunner, make_scheduler, make_seq, run_step


def prefill(scheduler, runner, *seqs):
    """Add the sequences and run until none is waiting or in its prompt."""
    for seq in seqs:
        scheduler.add(seq)
    while scheduler.waiting or any(s.num_uncomputed_tokens > 1 for s in scheduler.running):
        batch, _ = run_step(scheduler, runner)
        assert batch is not None, "prompts wait but nothing was scheduled"


def finish(scheduler, runner, max_steps=100):
    """Run until every sequence is finished."""
    for _ in range(max_steps):
        if not scheduler.has_unfinished():
            return
        run_step(scheduler, runner)
    pytest.fail(f"not finished after {max_steps} steps")


def assert_pool_whole(scheduler):
    bm = scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    assert all(block.ref_count == 0 for block in bm.blocks.values())


class TestSchedulerConfig:
    def test_from_runtime_takes_the_values_the_scheduler_reads(self):
        runtime = RuntimeConfig(max_num_seqs=3, max_num_batched_tokens=100, max_model_len=512,
                                scheduler_delay_factor=0.5)
        config = SchedulerConfig.from_runtime(runtime, max_model_len=200)   # capped by the artifact
        assert config == SchedulerConfig(max_num_seqs=3, max_num_batched_tokens=100, max_model_len=200,
                                         scheduler_delay_factor=0.5)

    def test_the_step_budget_default_is_the_targets(self):
        assert RuntimeConfig().max_num_batched_tokens is None
        assert RuntimeConfig().for_target("cpu").max_num_batched_tokens == DEFAULT_STEP_TOKENS_CPU
        assert RuntimeConfig().for_target("sm90").max_num_batched_tokens == DEFAULT_STEP_TOKENS_GPU
        assert RuntimeConfig(max_num_batched_tokens=100).for_target("cpu").max_num_batched_tokens == 100
        assert DEFAULT_STEP_TOKENS_CPU < DEFAULT_STEP_TOKENS_GPU

    def test_the_offline_engine_takes_vllms_offline_step_budget_on_a_gpu(self):
        """LLMEngine's default on a GPU is vLLM's LLM class's on 70 GiB+ GPUs (16384), the server's 8192; one asked
        for is kept, and the CPU's stays short."""
        assert RuntimeConfig().for_offline("sm90").max_num_batched_tokens == DEFAULT_STEP_TOKENS_GPU_OFFLINE == 16384
        assert RuntimeConfig().for_offline("gfx942").for_target("gfx942").max_num_batched_tokens == 16384
        assert RuntimeConfig(max_num_batched_tokens=100).for_offline("sm90").max_num_batched_tokens == 100
        assert RuntimeConfig().for_offline("cpu").for_target("cpu").max_num_batched_tokens == DEFAULT_STEP_TOKENS_CPU

    def test_needs_a_step_budget(self):
        with pytest.raises(ValueError, match="step budget"):
            SchedulerConfig.from_runtime(RuntimeConfig(), max_model_len=64)

    @pytest.mark.parametrize("fields, named", [(dict(max_num_seqs=0), "max_num_seqs"),
                                               (dict(max_model_len=0), "max_model_len"),
                                               (dict(scheduling_policy="lifo"), "scheduling_policy")])
    def test_a_directly_made_config_is_checked_for_what_the_scheduler_relies_on(self, fields, named):
        """Made from a RuntimeConfig it was checked there (once); made directly, the scheduler's own needs."""
        with pytest.raises(ValueError, match=named):
            SchedulerConfig(**{**dict(max_num_seqs=2, max_num_batched_tokens=5, max_model_len=64,
                                      scheduler_delay_factor=0.0), **fields})


class TestMixedSteps:
    def test_a_new_prompt_runs_beside_the_decodes(self):
        scheduler, runner = make_scheduler(), FakeRunner()
        a, b = make_seq(range(10, 15), "a"), make_seq(range(20, 26), "b")
        prefill(scheduler, runner, a)
        scheduler.add(b)
        batch, advanced = run_step(scheduler, runner)
        assert batch.is_prefill and batch.seqs == (a, b) and batch.num_new_tokens == (1, 6)
        assert advanced == [a, b]

    def test_decode_batches_every_running_sequence_one_token_each(self):
        scheduler, runner = make_scheduler(), FakeRunner()
        seqs = [make_seq(range(10, 10 + n), f"s{n}") for n in (3, 5, 9)]
        prefill(scheduler, runner, *seqs)
        batch, advanced = run_step(scheduler, runner)
        assert not batch.is_prefill and batch.seqs == tuple(seqs) and batch.num_new_tokens == (1, 1, 1)
        assert advanced == seqs and all(s.output_token_ids == [FILLER, FILLER] for s in seqs)

    def test_every_chunk_of_a_long_prompt_carries_the_decodes(self):
        """A prompt longer than the budget never holds a decode back: each step decodes every running
        sequence and the prompt advances by what the budget has left, at most."""
        scheduler, runner = make_scheduler(max_num_batched_tokens=8), FakeRunner()
        a, b = make_seq(range(10, 13), "a"), make_seq(range(20, 25), "b")
        prefill(scheduler, runner, a, b)
        long = make_seq(range(100, 140), "long")
        scheduler.add(long)
        computed = []
        while long.num_uncomputed_tokens > 1 or not computed:
            batch, _ = run_step(scheduler, runner)
            assert batch.is_prefill and batch.seqs == (a, b, long) and batch.num_new_tokens[:2] == (1, 1)
            assert batch.num_tokens <= 8
            computed.append(batch.num_new_tokens[2])
        assert computed == [6] * 6 + [4] and long.output_token_ids == [FILLER]
        assert a.num_output_tokens == b.num_output_tokens == 1 + len(computed)

    def test_a_new_prompt_gets_half_the_budget_beside_a_prompt_in_progress(self):
        scheduler, runner = make_scheduler(max_num_batched_tokens=8), FakeRunner()
        long, short = make_seq(range(100, 140), "long"), make_seq(range(10, 13), "short")
        scheduler.add(long)
        run_step(scheduler, runner)
        scheduler.add(short)
        batch, advanced = run_step(scheduler, runner)
        # long is held to half (4), short takes 3, and the token short leaves goes back to long
        assert batch.seqs == (long, short) and batch.num_new_tokens == (5, 3) and advanced == [short]
        assert batch.num_computed_tokens == (8, 0)

    def test_a_stream_of_new_prompts_does_not_stop_a_long_one(self):
        scheduler, runner = make_scheduler(max_num_batched_tokens=8, max_num_seqs=64), FakeRunner()
        long = make_seq(range(100, 140), "long")
        scheduler.add(long)
        run_step(scheduler, runner)
        for i in range(8):
            before = long.num_computed_tokens
            scheduler.add(make_seq(range(200 + 10 * i, 208 + 10 * i), f"new{i}"))
            batch, _ = run_step(scheduler, runner)
            assert batch.num_tokens <= 8 and long.num_computed_tokens - before >= 4 - (8 - len(batch.seqs))

    def test_what_no_new_prompt_can_take_goes_to_the_prompt_in_progress(self):
        scheduler, runner = make_scheduler(max_num_batched_tokens=8, max_num_seqs=2), FakeRunner()
        a = make_seq(range(10, 13), "a")
        prefill(scheduler, runner, a)
        long = make_seq(range(100, 140), "long")
        scheduler.add(long)
        run_step(scheduler, runner)
        scheduler.add(make_seq(range(50, 53), "c"))      # max_num_seqs: it cannot run yet
        batch, _ = run_step(scheduler, runner)
        assert batch.seqs == (a, long) and batch.num_new_tokens == (1, 7)

    def test_decodes_that_would_take_the_whole_budget_leave_it_to_the_prompt(self):
        scheduler, runner = make_scheduler(max_num_batched_tokens=4), FakeRunner()
        seqs = [make_seq(range(10 * i, 10 * i + 3), f"s{i}") for i in range(1, 5)]
        for seq in seqs:
            prefill(scheduler, runner, seq)
        scheduler.add(make_seq(range(100, 106), "new"))
        batch, _ = run_step(scheduler, runner)
        assert [s.request_id for s in batch.seqs] == ["new"] and batch.num_new_tokens == (4,)


class TestTokenBudget:
    def test_long_prompt_is_chunked_from_num_computed_tokens(self):
        scheduler, runner = make_scheduler(max_num_batched_tokens=8), FakeRunner()
        seq = make_seq(range(20))
        scheduler.add(seq)
        batches = [run_step(scheduler, runner) for _ in range(3)]
        assert [s.num_new_tokens for s in runner.steps] == [(8,), (8,), (4,)]
        assert [s.starts for s in runner.steps] == [(0,), (8,), (16,)]
        assert [advanced for _, advanced in batches] == [[], [], [seq]]   # only the last chunk samples
        assert seq.num_computed_tokens == 20 and seq.output_token_ids == [FILLER]

    def test_a_prompt_in_progress_shares_the_budget_with_a_new_one(self):
        scheduler, runner = make_scheduler(max_num_batched_tokens=8), FakeRunner()
        a, b = make_seq(range(20), "a"), make_seq(range(50, 56), "b")
        scheduler.add(a)
        run_step(scheduler, runner)
        scheduler.add(b)
        for _ in range(3):
            run_step(scheduler, runner)
        assert [s.request_ids for s in runner.steps] == [("a",), ("a", "b"), ("a",), ("a", "b")]
        assert [s.num_new_tokens for s in runner.steps] == [(8,), (4, 4), (8,), (1, 2)]   # a: half while b waits
        assert [s.starts for s in runner.steps] == [(0,), (8, 0), (12,), (20, 4)]           # then a decodes beside b

    def test_budget_is_shared_by_several_prompts(self):
        scheduler, runner = make_scheduler(max_num_batched_tokens=12), FakeRunner()
        for i in range(3):
            scheduler.add(make_seq(range(10 * i, 10 * i + 5), f"s{i}"))
        batch, advanced = run_step(scheduler, runner)
        assert batch.num_new_tokens == (5, 5, 2) and [s.request_id for s in advanced] == ["s0", "s1"]


class TestMaxNumSeqs:
    def test_caps_running_sequences(self):
        scheduler, runner = make_scheduler(max_num_seqs=2), FakeRunner()
        seqs = [make_seq(range(10 * i, 10 * i + 3), f"s{i}", max_tokens=2) for i in range(3)]
        for seq in seqs:
            scheduler.add(seq)
        batch, _ = run_step(scheduler, runner)
        assert batch.seqs == tuple(seqs[:2]) and list(scheduler.waiting) == [seqs[2]]
        run_step(scheduler, runner)                      # decode: s0 and s1 reach max_tokens
        batch, _ = run_step(scheduler, runner)
        assert batch.seqs == (seqs[2],) and len(scheduler.running) == 1


class TestPreemption:
    def test_the_youngest_is_preempted_and_recomputed_from_prompt_and_output(self):
        scheduler, runner = make_scheduler(3, enable_prefix_caching=False), FakeRunner({"a": [7, 8]})
        a, b = make_seq(range(10, 14), "a", max_tokens=2), make_seq(range(20, 24), "b", max_tokens=3)
        prefill(scheduler, runner, a, b)                 # one block each, full; one block free
        batch, _ = run_step(scheduler, runner)           # both need a new block: b gives way
        assert batch.seqs == (a,) and scheduler.num_preemptions == 1
        assert b.status == SequenceStatus.WAITING and list(scheduler.waiting) == [b]
        assert b.block_table == [] and b.num_computed_tokens == 0
        assert a.finish_reason == "length"               # a's second token; its blocks come back
        batch, _ = run_step(scheduler, runner)
        assert batch.is_prefill and batch.num_new_tokens == (5,)   # 4 prompt tokens + 1 generated
        prefill(scheduler, runner)
        finish(scheduler, runner)
        assert b.output_token_ids == [FILLER] * 3 and b.num_prompt_tokens == 4
        assert_pool_whole(scheduler)

    def test_order_is_youngest_first_and_preempted_go_to_the_front(self):
        scheduler, runner = make_scheduler(3, enable_prefix_caching=False), FakeRunner()
        a, b, c = (make_seq(range(10 * i, 10 * i + 4), name) for i, name in enumerate("abc", 1))
        prefill(scheduler, runner, a, b, c)              # the pool is full
        d = make_seq(range(90, 93), "d")
        scheduler.add(d)                                 # cannot be admitted: no free block
        batch, _ = run_step(scheduler, runner)           # a needs a block: c goes, then b
        assert batch.seqs == (a,) and not batch.is_prefill
        assert list(scheduler.waiting) == [b, c, d] and list(scheduler.running) == [a]
        assert scheduler.num_preemptions == 2

    def test_blocks_are_accounted_after_preemption_and_finish(self):
        scheduler, runner = make_scheduler(5, max_model_len=24), FakeRunner()
        seqs = [make_seq(range(10 * i, 10 * i + 6), f"s{i}", max_tokens=6) for i in range(3)]
        prefill(scheduler, runner, *seqs)
        bm = scheduler.block_manager
        for _ in range(100):
            if not scheduler.has_unfinished():
                break
            run_step(scheduler, runner)
            held = sum(len(s.block_table) for s in scheduler.running)
            assert bm.num_free_blocks == bm.num_blocks - held   # no block is shared: distinct prompts
            assert all(not s.block_table for s in scheduler.waiting)
        assert scheduler.num_preemptions > 0 and not scheduler.has_unfinished()
        assert all(s.output_token_ids == [FILLER] * 6 for s in seqs)
        assert_pool_whole(scheduler)

    def test_a_prompt_that_cannot_fit_beside_running_sequences_waits(self):
        """Admitting a prompt on its first chunk alone let it preempt itself at a later chunk and be
        readmitted, forever, while the sequence holding the blocks never decoded."""
        scheduler = make_scheduler(4, max_num_batched_tokens=4, max_model_len=16, enable_prefix_caching=False)
        runner = FakeRunner()
        a = make_seq(range(10, 18), "a", max_tokens=6)   # two blocks
        prefill(scheduler, runner, a)
        b = make_seq(range(20, 32), "b", max_tokens=2)   # needs three: waits until a finishes
        scheduler.add(b)
        for _ in range(20):
            run_step(scheduler, runner)
        assert a.finish_reason == b.finish_reason == "length" and scheduler.num_preemptions == 0
        assert [s.starts for s in runner.steps if s.request_ids == ("b",) and s.is_prefill] == [(0,), (4,), (8,)]


class TestPrefixCache:
    def test_cached_blocks_are_not_recomputed(self):
        scheduler, runner = make_scheduler(), FakeRunner()
        a = make_seq(range(10), "a", max_tokens=1)
        prefill(scheduler, runner, a)                    # finishes at once, two full blocks cached
        b = make_seq(list(range(8)) + [70, 71, 72], "b")
        scheduler.add(b)
        batch, _ = run_step(scheduler, runner)
        assert batch.num_new_tokens == (3,) and runner.steps[-1].starts == (8,) and b.num_cached_tokens == 8

    def test_prompt_logprobs_score_every_token(self):
        scheduler, runner = make_scheduler(), FakeRunner()
        prefill(scheduler, runner, make_seq(range(10), "a", max_tokens=1))
        b = make_seq(range(10), "b", prompt_logprobs=0)
        scheduler.add(b)
        batch, _ = run_step(scheduler, runner)
        assert batch.num_new_tokens == (10,) and b.num_cached_tokens == 0

    def test_scored_prompt_positions_per_step_are_capped(self):
        """A step scores at most 4 x max_num_seqs prompt positions (logits rows over the vocabulary, which the
        engine keeps room for): a scored prompt is chunked to that; one that is not scored is not."""
        scheduler, runner = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64), FakeRunner()   # cap 8
        scored = make_seq(range(20), "scored", prompt_logprobs=1)
        plain = make_seq(range(30, 50), "plain")
        scheduler.add(scored), scheduler.add(plain)
        batch, _ = run_step(scheduler, runner)
        assert batch.num_new_tokens == (8, 20)            # 8 positions scored; the plain prompt whole
        batch, _ = run_step(scheduler, runner)
        assert batch.num_new_tokens == (1, 8)             # plain decodes; positions 8..15 scored
        batch, _ = run_step(scheduler, runner)
        assert batch.num_new_tokens == (1, 4) and batch.sampling == (True, True)   # 16..18 scored, 19 samples

    def test_a_waiting_scored_prompt_waits_when_the_step_scored_enough(self):
        scheduler, runner = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64), FakeRunner()
        first = make_seq(range(8), "first", prompt_logprobs=0)       # scores 7 positions
        second = make_seq(range(10, 14), "second", prompt_logprobs=0)
        third = make_seq(range(20, 24), "third")
        scheduler.add(first), scheduler.add(second), scheduler.add(third)
        batch, _ = run_step(scheduler, runner)
        assert [s.request_id for s in batch.seqs] == ["first", "second"] and batch.num_new_tokens == (8, 1)
        batch, _ = run_step(scheduler, runner)
        assert [s.request_id for s in batch.seqs] == ["first", "second"] and batch.num_new_tokens == (1, 3)


class TestDelayFactor:
    def test_never_holds_back_when_idle(self):
        clock = FakeClock()
        scheduler, runner = make_scheduler(scheduler_delay_factor=100.0, clock=clock), FakeRunner()
        scheduler.add(make_seq(range(5), "a"))
        assert run_step(scheduler, runner)[0].is_prefill

    def test_holds_new_prompts_back_while_running(self):
        clock = FakeClock()
        scheduler, runner = make_scheduler(scheduler_delay_factor=1.0, clock=clock), FakeRunner()
        a = make_seq(range(5), "a")
        scheduler.add(a)
        batch = scheduler.schedule()                     # a's prefill, at t=0
        clock.advance(0.5)
        scheduler.update(batch, runner.run(batch).sampled)   # read at t=0.5: new prompts wait up to 0.5 s
        b = make_seq(range(20, 25), "b", arrival_time=clock.now)
        scheduler.add(b)
        clock.advance(0.4)
        batch, _ = run_step(scheduler, runner)
        assert not batch.is_prefill and batch.seqs == (a,)
        clock.advance(0.2)                               # b has waited 0.6 s
        batch, _ = run_step(scheduler, runner)
        assert batch.is_prefill and batch.seqs == (a, b) and batch.num_new_tokens == (1, 5)

    def test_timings_come_from_the_clock(self):
        clock = FakeClock(5.0)
        scheduler, runner = make_scheduler(clock=clock), FakeRunner()
        seq = make_seq(range(5), max_tokens=2)
        prefill(scheduler, runner, seq)
        clock.advance(1.0)
        run_step(scheduler, runner)
        assert (seq.first_token_time, seq.finish_time) == (5.0, 6.0)


class TestAbort:
    def test_waiting(self):
        scheduler = make_scheduler()
        seq = make_seq(range(5), "a")
        scheduler.add(seq)
        assert scheduler.abort("a") is seq
        assert seq.finish_reason == "abort" and seq.is_finished and not scheduler.has_unfinished()

    def test_running_frees_its_blocks(self):
        scheduler, runner = make_scheduler(), FakeRunner()
        a, b = make_seq(range(10), "a"), make_seq(range(20, 30), "b")
        prefill(scheduler, runner, a, b)
        assert scheduler.abort("a", reason="stop") is a
        assert list(scheduler.running) == [b] and a.finish_reason == "stop" and a.block_table == []
        assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks - len(b.block_table)
        scheduler.abort("b")
        assert_pool_whole(scheduler)

    def test_during_a_step_the_result_is_dropped(self):
        scheduler, runner = make_scheduler(), FakeRunner()
        seq = make_seq(range(10), "a")
        scheduler.add(seq)
        batch = scheduler.schedule()
        scheduler.abort("a")
        assert scheduler.update(batch, runner.run(batch).sampled) == []
        assert seq.output_token_ids == [] and seq.num_computed_tokens == 0
        assert_pool_whole(scheduler)

    def test_during_a_chunked_prompt_it_stops_at_the_next_chunk_and_returns_its_blocks(self):
        """A client that leaves while its long prompt prefills: the chunk in flight is dropped, no other
        chunk runs, and its blocks come back at once (the decodes beside it go on)."""
        scheduler, runner = make_scheduler(max_num_batched_tokens=8), FakeRunner()
        a = make_seq(range(10, 13), "a")
        prefill(scheduler, runner, a)
        long = make_seq(range(100, 140), "long")
        scheduler.add(long)
        run_step(scheduler, runner)
        batch = scheduler.schedule()                     # long's second chunk is in flight
        assert batch.seqs == (a, long)
        assert scheduler.abort("long") is long and long.finish_reason == "abort" and long.block_table == []
        bm = scheduler.block_manager
        assert bm.num_free_blocks == bm.num_blocks - len(a.block_table)
        assert scheduler.update(batch, runner.run(batch).sampled) == [a]
        assert long.num_output_tokens == 0
        batch, _ = run_step(scheduler, runner)
        assert batch.seqs == (a,) and not batch.is_prefill
        scheduler.abort("a")
        assert_pool_whole(scheduler)

    def test_unknown_or_finished_ids_are_ignored(self):
        scheduler, runner = make_scheduler(), FakeRunner()
        seq = make_seq(range(5), "a", max_tokens=1)
        prefill(scheduler, runner, seq)
        assert seq.finish_reason == "length"
        assert scheduler.abort("a") is None and scheduler.abort("nobody") is None
        assert seq.finish_reason == "length"

    def test_does_not_walk_the_queues(self, monkeypatch):
        """256,000 sequences of one request were aborted by scanning the queues once per id."""
        scheduler = make_scheduler()
        for i in range(100_000):
            scheduler.add(make_seq([5], str(i)))
        monkeypatch.setattr(SequenceQueue, "__iter__", lambda self: pytest.fail("abort walked a queue"))
        start = time.perf_counter()
        for i in range(100_000):
            scheduler.abort(str(i))
        assert time.perf_counter() - start < 2.0
        assert not scheduler.has_unfinished()

    def test_preserves_the_order_of_the_rest(self):
        scheduler = make_scheduler()
        seqs = [make_seq([5], str(i)) for i in range(5)]
        for seq in seqs:
            scheduler.add(seq)
        scheduler.abort("0"), scheduler.abort("3")
        assert list(scheduler.waiting) == [seqs[1], seqs[2], seqs[4]]

    def test_a_request_id_in_use_is_refused(self):
        scheduler = make_scheduler()
        scheduler.add(make_seq([5], "a"))
        with pytest.raises(RequestError, match="'a' is already in the engine"):
            scheduler.add(make_seq([6], "a"))


class TestStopReasons:
    @pytest.mark.parametrize("params, script, reason, num_output", [
        (dict(max_tokens=5), [9, EOS], "stop", 2),
        (dict(max_tokens=5, ignore_eos=True), [9, EOS], "length", 5),
        (dict(max_tokens=5, stop_token_ids=[9]), [8, 9], "stop", 2),
        (dict(max_tokens=5, stop_token_ids=[9], ignore_eos=True), [EOS, 9], "stop", 2),
        (dict(max_tokens=3), [], "length", 3),
        (dict(max_tokens=None), [], "length", 16 - 6),   # up to max_model_len
    ])
    def test_reason(self, params, script, reason, num_output):
        scheduler, runner = make_scheduler(max_model_len=16), FakeRunner({"r": script})
        seq = make_seq(range(10, 16), **params)
        scheduler.add(seq)
        finish(scheduler, runner)
        assert seq.finish_reason == reason and seq.num_output_tokens == num_output
        assert_pool_whole(scheduler)
