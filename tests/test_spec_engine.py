"""Speculative decoding end to end on tiny random models (eager artifacts): greedy outputs equal
to decoding without it for the n-gram and draft-model proposers, acceptance as the draft implies,
stops inside an accepted run, preemption and prefix caching, sampled tokens that follow the
target's distribution, the statistics (print_mtp_statistics, /metrics) and refusals."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from atom_aot import LLMEngine, SamplingParams
from atom_aot.errors import StartupError
from atom_aot.runtime.processes.client import EngineStatus
from atom_aot.runtime.processes.messages import EngineStats, Heartbeat
from atom_aot.runtime.spec.setup import check_draft
from atom_aot.server.lifecycle.metrics import ServerMetrics
from factories import make_tiny_model, random_prompts
from test_spec_rejection import chi_square_p_value

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tiny_llama_eager_artifact):
    return str(tiny_llama_eager_artifact)


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory, build_artifact) -> str:
    """Another random model with the same tokenizer (the factory trains it the same way)."""
    return str(build_artifact(make_tiny_model(tmp_path_factory.mktemp("draft") / "tiny-llama-1", seed=1),
                              compile="none"))


@pytest.fixture(scope="module")
def prompts():
    """Random prompts that repeat their start, so prompt lookup finds something to copy."""
    return [p + p[:12] for p in random_prompts(4, 300, seed=3, lengths=(6, 30))]


@pytest.fixture(scope="module")
def baseline(target):
    return LLMEngine(target)


def tokens(engine, prompts, params) -> list[list[int]]:
    outs = engine.generate(prompts, params)
    assert engine.is_finished()
    assert engine.core.block_manager.num_free_blocks == engine.core.block_manager.num_blocks
    return [o["token_ids"] for o in outs]


def speculative(target, **options) -> LLMEngine:
    return LLMEngine(target, num_speculative_tokens=options.pop("k", 3), **options)


class TestGreedyEquality:
    def test_ngram(self, target, baseline, prompts):
        engine = speculative(target, method="ngram")
        assert tokens(engine, prompts, GREEDY) == tokens(baseline, prompts, GREEDY)
        stats = engine.print_mtp_statistics()
        assert stats["proposed_total"] > 0 and stats["accepted_total"] > 0

    def test_the_same_model_as_draft_accepts_everything(self, target, baseline, prompts):
        engine = speculative(target, method="draft", draft_model=target)
        assert tokens(engine, prompts, GREEDY) == tokens(baseline, prompts, GREEDY)
        stats = engine.print_mtp_statistics()
        assert stats["acceptance_rate"] == 1.0 and stats["acceptance_per_position"] == [1.0, 1.0, 1.0]
        assert stats["mean_accepted_length"] > 3.5                 # 4 tokens per step but at max_tokens

    def test_another_random_draft_accepts_little_and_changes_nothing(self, target, other_draft, baseline, prompts):
        engine = speculative(target, method="draft", draft_model=other_draft)
        assert tokens(engine, prompts, GREEDY) == tokens(baseline, prompts, GREEDY)
        stats = engine.print_mtp_statistics()
        assert stats["proposed_total"] > 0 and stats["acceptance_rate"] < 0.2


def test_logprobs_of_every_token_of_a_run(target, baseline, prompts):
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2)

    def logprobs(engine) -> list[list]:
        ids = engine.add_request(prompts[:2], params)
        got = {request_id: [] for request_id in ids}
        while not engine.is_finished():
            for update in engine.step():
                got[update.request_id] += [(lp.token_id, lp.logprob, [t for t, _ in lp.top]) for lp in update.logprobs]
        return [got[request_id] for request_id in ids]

    ours = logprobs(speculative(target, method="draft", draft_model=target))
    theirs = logprobs(baseline)
    assert [[(t, top) for t, _, top in seq] for seq in ours] == [[(t, top) for t, _, top in seq] for seq in theirs]
    assert [lp for seq in ours for _, lp, _ in seq] == pytest.approx([lp for seq in theirs for _, lp, _ in seq],
                                                                       abs=1e-4)
    assert all(len(seq) == 10 for seq in ours)


class TestStopsInsideARun:
    """The draft is the model itself: every run is K + 1 = 4 tokens, so stops land inside runs."""

    @pytest.fixture(scope="class")
    def engine(self, target):
        return speculative(target, method="draft", draft_model=target)

    def test_max_tokens(self, engine, baseline, prompts):
        params = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
        assert tokens(engine, prompts, params) == tokens(baseline, prompts, params)

    def test_stop_tokens_and_stop_strings(self, engine, baseline, prompts):
        first = baseline.generate(prompts[:1], GREEDY)[0]
        stop_token = first["token_ids"][5]
        stop_string = first["text"][len(first["text"]) // 2:][:3]
        for params in (SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop_token]),
                       SamplingParams(temperature=0, max_tokens=24, stop_strings=[stop_string])):
            ours, theirs = engine.generate(prompts, params), baseline.generate(prompts, params)
            assert [(o["token_ids"], o["text"], o["finish_reason"]) for o in ours] == \
                   [(o["token_ids"], o["text"], o["finish_reason"]) for o in theirs]
            assert ours[0]["finish_reason"] == "stop"


def test_preemption_and_prefix_caching(target, baseline):
    shared = random_prompts(1, 300, seed=5, lengths=(40, 40))[0]
    prompts = [shared + p + p for p in random_prompts(6, 300, seed=6, lengths=(4, 10))]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = tokens(baseline, prompts, params)
    for method, extra in (("ngram", {}), ("draft", {"draft_model": target})):
        engine = speculative(target, method=method, num_kv_blocks=14, max_model_len=96, **extra)
        assert tokens(engine, prompts, params) == expected, method
        assert engine.core.scheduler.num_preemptions > 0, method
        assert tokens(engine, prompts[:2], params) == expected[:2], method      # again, from the prefix cache
        assert engine.core.block_manager.prefix_hits > 0, method


def test_sampled_tokens_follow_the_targets_distribution(target, baseline):
    """top-k 2 at temperature 1: the token after the first, verified with the model itself as draft
    (accepted with p(draft), else drawn from the residual), against its exact top-2 probabilities."""
    prompt = random_prompts(1, 300, seed=8, lengths=(12, 12))[0]
    engine = speculative(target, method="draft", draft_model=target, k=1)
    outs = engine.generate([prompt] * 240, [SamplingParams(top_k=2, max_tokens=3, seed=s) for s in range(240)])
    firsts = [o["token_ids"][0] for o in outs]
    first = max(set(firsts), key=firsts.count)                 # condition on the commonest first token
    seconds = [o["token_ids"][1] for o in outs if o["token_ids"][0] == first]
    exact = baseline.add_request([prompt + [first]], SamplingParams(temperature=0, max_tokens=1, logprobs=2))
    top = next(u for _ in range(20) for u in baseline.step() if u.request_id == exact[0]).logprobs[0].top
    probs = torch.tensor([lp for _, lp in top]).exp()
    counts = torch.tensor([float(seconds.count(token)) for token, _ in top])
    assert counts.sum() == len(seconds) >= 120
    assert chi_square_p_value(counts, probs / probs.sum()) > 1e-3
    assert 0 < engine.print_mtp_statistics()["acceptance_rate"] < 1


def test_a_seeded_request_gets_the_same_tokens_in_any_batch(target, prompts):
    engine = speculative(target, method="draft", draft_model=target)      # proposes at every step
    seeded = SamplingParams(max_tokens=16, seed=11, ignore_eos=True)
    unseeded = SamplingParams(max_tokens=16, ignore_eos=True)
    alone = engine.generate(prompts[:1], seeded)[0]["token_ids"]
    assert engine.generate(prompts, [seeded, unseeded, unseeded, unseeded])[0]["token_ids"] == alone
    assert engine.print_mtp_statistics()["proposed_total"] > 0


def test_acceptance_counters_in_metrics(target, prompts):
    engine = speculative(target, method="ngram", k=2)
    engine.generate(prompts, GREEDY)
    stats = engine.core.stats()          # what the server's engine process sends with its heartbeat
    status = EngineStatus(alive=True, heartbeat=Heartbeat(steps=1, stats=EngineStats(stats, {})), heartbeat_age_s=0.0)
    text = ServerMetrics().render(status).decode()
    for position in range(2):
        assert f'atom_spec_decode_num_draft_tokens_total{{position="{position}"}} {stats.spec.proposed[position]}.0' in text
        assert f'atom_spec_decode_num_accepted_tokens_total{{position="{position}"}} {stats.spec.accepted[position]}.0' \
            in text
    assert f"atom_spec_decode_mean_accepted_length {stats.spec.mean_accepted_length}" in text


class TestRefusals:
    def test_mtp_on_a_model_without_mtp_layers(self, target):
        with pytest.raises(StartupError, match=r"--method mtp needs a model with MTP layers.*has none"):
            LLMEngine(target, method="mtp", num_speculative_tokens=1)

    def test_statistics_without_speculation(self, baseline):
        with pytest.raises(RuntimeError, match="speculative decoding is off"):
            baseline.print_mtp_statistics()

    def test_options_are_checked_before_loading(self, target):
        with pytest.raises(ValueError, match="draft_model .* exactly with --method draft"):
            LLMEngine(target, method="draft", num_speculative_tokens=2)

    @pytest.mark.parametrize("draft, problem", [
        (dict(tokenizer_hash="b" * 32), "has another tokenizer"),
        (dict(max_model_len=64), "built for sequences of up to 64 tokens, fewer than the 128 served"),
        (dict(device=torch.device("cuda")), "runs on cuda"),
    ])
    def test_a_draft_model_that_cannot_serve_as_one(self, draft, problem):
        def loaded(tokenizer_hash="a" * 32, max_model_len=128, device=torch.device("cpu")):
            model = SimpleNamespace(name="m", tokenizer_hash=tokenizer_hash)
            return SimpleNamespace(manifest=SimpleNamespace(model=model), path="m.atom", max_model_len=max_model_len,
                                   device=device)
        check_draft(loaded(), loaded(), 128)
        with pytest.raises(StartupError, match=problem):
            check_draft(loaded(), loaded(**draft), 128)
