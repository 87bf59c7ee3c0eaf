"""EngineCore over a fake model runner: request checks, what a step hands out, prompt logprobs,
counters and aborts. No model: tests/engine_factories.py."""
import random
import time

import pytest

from atom_aot.errors import ContextLengthError, RequestError
from atom_aot.runtime.sampling_params import SamplingParams
from engine_factories import EOS, FILLER, FakeRunner, make_core, run_to_end


def pool_is_whole(core) -> bool:
    return core.block_manager.num_free_blocks == core.block_manager.num_blocks


def queue_lengths(core) -> tuple[int, int]:
    """(running, waiting), as stats() reports them."""
    return len(core.scheduler.running), len(core.scheduler.waiting)


class TestAddRequest:
    def test_empty_prompt(self):
        with pytest.raises(RequestError, match="the prompt is empty"):
            make_core().add_request([], SamplingParams())

    def test_prompt_and_max_tokens_must_fit_the_context(self):
        core = make_core(max_model_len=16)
        with pytest.raises(ContextLengthError, match=r"maximum context length is 16 tokens.*18 \(10 in the prompt"):
            core.add_request(list(range(10)), SamplingParams(max_tokens=8))
        with pytest.raises(ContextLengthError):                        # no max_tokens: one token must fit
            core.add_request(list(range(16)), SamplingParams(max_tokens=None))
        core.add_request(list(range(15)), SamplingParams(max_tokens=None))
        assert queue_lengths(core) == (0, 1) and core.num_prompt_tokens_total == 15

    def test_prompt_tokens_must_be_in_the_vocabulary(self):
        core = make_core(vocab_size=100)
        with pytest.raises(RequestError, match=r"prompt token id 100 is outside the model's vocabulary \(0..99\)"):
            core.add_request([5, 100, 7], SamplingParams(max_tokens=4))
        core.add_request([5, 99], SamplingParams(max_tokens=4))           # nothing lost: the next one is taken
        assert queue_lengths(core) == (0, 1) and core.num_prompt_tokens_total == 2

    @pytest.mark.parametrize("field, params", [
        ("stop_token_ids", {"stop_token_ids": [3, 100]}),
        ("logit_bias", {"logit_bias": {100: 1.0}}),
        ("allowed_token_ids", {"allowed_token_ids": [5, 100]}),
        ("bad_words_token_ids", {"bad_words_token_ids": [[5], [6, 100]]}),
    ])
    def test_every_token_id_a_request_names_must_be_in_the_vocabulary(self, field, params):
        """The sampler indexes logits rows with them: one past the vocabulary is refused, not indexed."""
        core = make_core(vocab_size=100)
        with pytest.raises(RequestError, match=rf"{field}: token id 100 is outside the model's vocabulary"):
            core.add_request([5, 7], SamplingParams(max_tokens=4, **params))
        assert queue_lengths(core) == (0, 0)

    def test_request_ids(self):
        core = make_core()
        params = SamplingParams(max_tokens=4)
        first, second = (core.add_request([5, 6], params) for _ in range(2))
        assert first != second and core.add_request([5], params, request_id="mine") == "mine"
        with pytest.raises(RequestError, match="already in the engine"):
            core.add_request([7], params, request_id="mine")
        assert queue_lengths(core) == (0, 3) and core.num_prompt_tokens_total == 5

    def test_a_seeded_request_gets_its_own_generator(self):
        runner = FakeRunner()
        core = make_core(runner=runner)
        core.add_request([5, 6], SamplingParams(max_tokens=4, seed=7))
        core.add_request([5, 6], SamplingParams(max_tokens=4))
        assert runner.sampler.seeds == [7]


class TestStep:
    def test_outputs_only_for_sequences_that_got_a_token(self):
        core = make_core(max_num_batched_tokens=8)
        short = core.add_request([5, 6, 7], SamplingParams(max_tokens=3))
        long = core.add_request(list(range(10, 30)), SamplingParams(max_tokens=3))
        assert [o.request_id for o in core.step()] == [short]          # long had 5 of its 20 computed
        assert [o.request_id for o in core.step()] == [short]          # short decodes beside long's chunks
        assert [o.request_id for o in core.step()] == [short]          # long: 19 of 20; short's third, its last
        assert [o.request_id for o in core.step()] == [long]

    def test_idle_step_is_empty(self):
        assert make_core().step() == []

    def test_output_fields(self):
        core = make_core(runner=FakeRunner({"r": [9, 11]}))
        core.add_request(list(range(10, 16)), SamplingParams(max_tokens=2, logprobs=0), request_id="r")
        first, second = run_to_end(core)
        assert (first.new_token_ids, first.finish_reason, first.num_prompt_tokens) == ([9], None, 6)
        assert first.logprobs[0].token_id == 9 and first.first_token_time is not None
        assert (second.new_token_ids, second.finish_reason) == ([11], "length")
        assert second.finish_time is not None and pool_is_whole(core)

    @pytest.mark.parametrize("params, script, reason, tokens, stop_token", [
        (SamplingParams(max_tokens=4), [9, EOS], "stop", [9, EOS], EOS),
        (SamplingParams(max_tokens=4, ignore_eos=True), [9, EOS], "length", [9, EOS, FILLER, FILLER], None),
        (SamplingParams(max_tokens=4, stop_token_ids=[9]), [8, 9], "stop", [8, 9], 9),
    ])
    def test_finish_reasons(self, params, script, reason, tokens, stop_token):
        """The last output names the token that stopped it (the output processor leaves its text out)."""
        core = make_core(runner=FakeRunner({"r": script}))
        core.add_request([5, 6, 7], params, request_id="r")
        outputs = run_to_end(core)
        assert [o.new_token_ids[0] for o in outputs] == tokens
        assert [o.finish_reason for o in outputs] == [None] * (len(tokens) - 1) + [reason]
        assert [o.stop_token_id for o in outputs] == [None] * (len(tokens) - 1) + [stop_token]


class TestPromptLogprobs:
    def test_sent_once_complete_with_the_first_token(self):
        core = make_core(max_num_batched_tokens=4)
        prompt = list(range(10, 20))
        core.add_request(prompt, SamplingParams(max_tokens=3, prompt_logprobs=1))
        outputs = run_to_end(core)
        scored = outputs[0].prompt_logprobs
        assert [lp.token_id for lp in scored] == prompt[1:]                         # 3 chunks, each once
        assert [lp.logprob for lp in scored] == [-(p + 1.0) for p in range(9)]     # positions 0..8
        assert all(o.prompt_logprobs is None for o in outputs[1:])

    def test_a_recomputed_prompt_is_not_sent_again(self):
        core = make_core(3, runner=FakeRunner(), enable_prefix_caching=False)
        core.add_request([10, 11, 12, 13], SamplingParams(max_tokens=2), request_id="old")
        core.add_request([20, 21, 22, 23], SamplingParams(max_tokens=3, prompt_logprobs=0), request_id="young")
        outputs = [o for o in run_to_end(core) if o.request_id == "young"]
        assert core.scheduler.num_preemptions == 1
        assert core.runner.steps[-2].starts == (0,)                    # "young" recomputed from scratch
        assert [o.prompt_logprobs is not None for o in outputs] == [True, False, False]
        assert len(outputs[0].prompt_logprobs) == 3
        assert [o.new_token_ids[0] for o in outputs] == [FILLER] * 3


class TestCounters:
    def test_counters(self):
        core = make_core(3, max_num_seqs=2, enable_prefix_caching=False)
        core.add_request([10, 11, 12, 13], SamplingParams(max_tokens=2))
        core.add_request([20, 21, 22, 23], SamplingParams(max_tokens=3))
        core.add_request([30, 31, 32], SamplingParams(max_tokens=1))
        core.step()
        assert queue_lengths(core) == (2, 1) and core.block_manager.num_free_blocks == 1
        run_to_end(core)
        assert core.num_prompt_tokens_total == 11 and core.num_generation_tokens_total == 6
        assert core.scheduler.num_preemptions >= 1 and queue_lengths(core) == (0, 0)
        assert core.block_manager.num_free_blocks == 3

    def test_prefix_cache_counters(self):
        core = make_core()
        for request_id in ("a", "b"):
            core.add_request(list(range(13)), SamplingParams(max_tokens=1), request_id=request_id)
            run_to_end(core)
        assert (core.block_manager.prefix_queries, core.block_manager.prefix_hits) == (6, 3)


class TestAbort:
    def test_mid_run_frees_blocks_and_stops_outputs(self):
        core = make_core()
        core.add_request(list(range(10)), SamplingParams(max_tokens=50), request_id="gone")
        core.add_request(list(range(20, 30)), SamplingParams(max_tokens=3), request_id="kept")
        core.step(), core.step()
        core.abort("gone")
        assert {o.request_id for o in run_to_end(core)} == {"kept"}
        assert pool_is_whole(core) and queue_lengths(core) == (0, 0)

    @pytest.mark.parametrize("async_scheduling", [False, True])
    def test_during_a_chunked_prompt_no_chunk_runs_after_it(self, async_scheduling):
        runner = FakeRunner()
        core = make_core(max_num_batched_tokens=8, runner=runner, async_scheduling=async_scheduling)
        core.add_request([5, 6, 7], SamplingParams(max_tokens=12), request_id="kept")
        core.add_request(list(range(10, 50)), SamplingParams(max_tokens=4), request_id="gone")
        core.step(), core.step()
        launched = len(runner.steps)
        core.abort("gone")
        outputs = run_to_end(core)
        assert all("gone" not in step.request_ids for step in runner.steps[launched:])
        assert {o.request_id for o in outputs} == {"kept"} and outputs[-1].finish_reason == "length"
        assert pool_is_whole(core) and queue_lengths(core) == (0, 0)

    def test_unknown_or_finished_ids_are_harmless(self):
        core = make_core()
        core.add_request([5, 6], SamplingParams(max_tokens=1), request_id="done")
        run_to_end(core)
        core.abort("done"), core.abort("never")
        assert not core.has_unfinished() and pool_is_whole(core)

    def test_a_request_of_100000_sequences_aborts_quickly(self):
        """A client that sent `prompt: [[5]] * 2000, n: 128` and went away wedged the engine for minutes."""
        core = make_core()
        ids = [core.add_request([5], SamplingParams(max_tokens=1)) for _ in range(100_000)]
        core.step()                                     # some run, the rest wait
        start = time.perf_counter()
        for request_id in ids:
            core.abort(request_id)
        assert time.perf_counter() - start < 2.0
        assert not core.has_unfinished() and pool_is_whole(core)


def random_workload(seed: int, async_scheduling: bool):
    """A small pool, budget and batch cap, and prompts long enough to be chunked and preempted."""
    rng = random.Random(seed)
    max_model_len = rng.choice([16, 24, 32])
    core = make_core(rng.randint(max_model_len // 4, max_model_len // 4 + 6), max_model_len=max_model_len,
                     max_num_batched_tokens=rng.randint(1, 20), max_num_seqs=rng.randint(1, 6),
                     enable_prefix_caching=rng.random() < 0.5, async_scheduling=async_scheduling)
    requests = {}
    for _ in range(rng.randint(1, 10)):
        prompt = [rng.randrange(3, 8) for _ in range(rng.randint(1, max_model_len - 2))]
        params = SamplingParams(max_tokens=rng.randint(1, max_model_len - len(prompt)),
                                prompt_logprobs=rng.choice([0, None]))
        requests[core.add_request(prompt, params)] = (prompt, params)
    return core, requests


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("seeds", [range(0, 60), range(60, 120)])
def test_random_workloads_finish_whole(seeds, async_scheduling):
    """Every request gets all its tokens, each prompt is scored once, and the pool comes back whole."""
    for seed in seeds:
        core, requests = random_workload(seed, async_scheduling)
        outputs = {}
        for o in run_to_end(core, max_steps=2000):
            outputs.setdefault(o.request_id, []).append(o)
        for request_id, (prompt, params) in requests.items():
            got = outputs[request_id]
            assert len(got) == params.max_tokens and got[-1].finish_reason == "length", seed
            if params.prompt_logprobs is not None:
                assert [lp.logprob for lp in got[0].prompt_logprobs] == [-(p + 1.0) for p in range(len(prompt) - 1)]
        assert pool_is_whole(core), seed
