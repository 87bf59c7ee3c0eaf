"""vLLM's engine-side request fields: cache_salt (prefix-cache blocks shared only between equal
salts), allowed_token_ids (every other token masked before sampling), priority (the priority
scheduling policy), and json_object's grammar."""
from __future__ import annotations

import pytest
import torch
from engine_factories import BLOCK_SIZE, FakeRunner, make_core, make_scheduler, make_seq, run_step, run_to_end

from atom_aot.errors import RequestError
from atom_aot.runtime.sampling.logits_processors import LogitsProcessors
from atom_aot.runtime.sampling_params import GrammarSpec, SamplingParams


def _cached_tokens(core, prompt: list[int], request_id: str, salt: str | None) -> int:
    core.add_request(prompt, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, cache_salt=salt),
                     request_id=request_id)
    return [out.num_cached_tokens for out in run_to_end(core) if out.request_id == request_id][-1]


def test_cache_salt_shares_prefix_blocks_only_between_equal_salts():
    core = make_core(64)
    prompt = list(range(100, 100 + 5 * BLOCK_SIZE + 1))
    assert _cached_tokens(core, prompt, "first", "tenant-a") == 0
    assert _cached_tokens(core, prompt, "other salt", "tenant-b") == 0
    assert _cached_tokens(core, prompt, "no salt", None) == 0
    assert _cached_tokens(core, prompt, "same salt", "tenant-a") == 5 * BLOCK_SIZE
    assert _cached_tokens(core, prompt, "no salt again", None) == 5 * BLOCK_SIZE


def test_allowed_token_ids_mask_every_other_token_of_their_row_only():
    logits = torch.randn(2, 32)
    seqs = [make_seq([1, 2, 3], "allowed", allowed_token_ids=[3, 7, 30], ignore_eos=True),
            make_seq([1, 2, 3], "free", ignore_eos=True, logit_bias={4: 1.0})]
    out = LogitsProcessors(torch.device("cpu")).apply(logits, seqs)
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [3, 7, 30]
    assert torch.equal(out[0, [3, 7, 30]], logits[0, [3, 7, 30]])
    assert torch.equal(out[1], logits[1] + torch.nn.functional.one_hot(torch.tensor(4), 32))


@pytest.mark.parametrize("fields, says", [
    ({"allowed_token_ids": []}, "must not be empty"),
    ({"allowed_token_ids": [5], "grammar": GrammarSpec("regex", "a+")}, "structured output"),
    ({"allowed_token_ids": [5, 6], "bad_words_token_ids": [[5], [6]]}, "leaves no token"),
    ({"allowed_token_ids": [5], "stop_token_ids": [5], "min_tokens": 2}, "leaves no token"),
    ({"cache_salt": ""}, "non-empty"),
])
def test_values_that_leave_nothing_to_do_are_refused(fields, says):
    with pytest.raises(ValueError, match=says):
        SamplingParams(**fields)


def test_the_data_parallel_router_keeps_a_salt_with_the_engine_that_holds_its_blocks():
    from atom_aot.runtime.processes.prefix_routing import PrefixRouter
    router, prompt = PrefixRouter(2, BLOCK_SIZE), list(range(100, 100 + 4 * BLOCK_SIZE))
    assert router.choose(prompt, [0, 0], "tenant-a") == 0
    assert router.choose(prompt, [3, 0], "tenant-a") == 0          # its blocks are there
    assert router.choose(prompt, [3, 0], "tenant-b") == 1          # another salt shares none of them
    assert router.choose(prompt, [3, 0]) == 1


@pytest.mark.parametrize("text, accepted", [('{"a": [1, {"b": null}]}', True), ("{}", True), ("[1, 2]", False),
                                            ('"text"', False), ("3", False)])
def test_json_object_means_an_object(text, accepted):
    """response_format json_object, as OpenAI and vLLM mean it: a top-level array is not one."""
    import xgrammar as xgr

    from atom_aot.runtime.sampling.grammar_worker import compile_spec
    vocab = [chr(c) for c in range(32, 127)] + ["</s>"]
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo(vocab, stop_token_ids=[len(vocab) - 1]))
    matcher = xgr.GrammarMatcher(compile_spec(compiler, "json_object", "", []), terminate_without_stop_token=True)
    assert (matcher.accept_string(text) and matcher.is_terminated()) == accepted


def test_the_priority_policy_admits_by_priority_then_arrival():
    scheduler = make_scheduler(max_num_seqs=1, scheduling_policy="priority")
    for name, priority, arrival in (("low", 5, 0.0), ("high", 0, 1.0), ("mid", 1, 2.0), ("high later", 0, 3.0)):
        scheduler.add(make_seq([1, 2, 3], name, arrival_time=arrival, priority=priority))
    assert [seq.request_id for seq in scheduler.waiting] == ["high", "high later", "mid", "low"]
    assert scheduler.abort("high later") is not None and scheduler.schedule().seqs[0].request_id == "high"
    assert [seq.request_id for seq in scheduler.waiting] == ["mid", "low"]


@pytest.mark.parametrize("policy, preempted", [("fcfs", "important"), ("priority", "casual")])
def test_the_priority_policy_preempts_the_lowest_priority_first(policy, preempted):
    """casual (priority 9) is admitted before important (0); when blocks run out, fcfs preempts the youngest
    (important), the priority policy the lowest priority (casual)."""
    scheduler, runner = make_scheduler(4, max_num_seqs=2, scheduling_policy=policy), FakeRunner()
    scheduler.add(make_seq(range(10, 17), "casual", arrival_time=0.0, priority=9, ignore_eos=True))
    run_step(scheduler, runner)
    scheduler.add(make_seq(range(20, 27), "important", arrival_time=1.0, priority=0, ignore_eos=True))
    for _ in range(4):
        run_step(scheduler, runner)
    assert scheduler.num_preemptions >= 1 and preempted in scheduler.waiting


def test_a_priority_under_first_come_first_served_is_refused():
    core = make_core(64)
    with pytest.raises(RequestError, match="--scheduling-policy priority"):
        core.add_request([1, 2, 3], SamplingParams(priority=3, max_tokens=1), request_id="urgent")
    core.add_request([1, 2, 3], SamplingParams(priority=0, max_tokens=1), request_id="plain")
