"""Speculative decoding over several ranks (CPU, gloo, ranks as processes): --method mtp on a tiny DeepSeek-V3
at -tp 2 (rank 0 sends each MTP step and its hidden states to rank 1, which runs its shard of the layer) and at
-dp 2 --ep (each rank's MTP steps meet the other's in the MTP layer's experts, a rank with fewer rows or none
padding its own), --method ngram at -dp 2 --ep; greedy outputs token for token equal to one rank decoding
without speculation, with drafts proposed and accepted. The alignment's bookkeeping is checked on its own."""
from __future__ import annotations

import pytest
import torch

from atom_aot import LLMEngine, SamplingParams
from atom_aot.runtime.parallel import attention_dp
from atom_aot.runtime.parallel.attention_dp import AlignedMTP
from deepseek_factories import make_copying_deepseek, make_tiny_deepseek
from factories import random_prompts

ENGINE = dict(num_kv_blocks=64, num_threads=1)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(5, 300, seed=17, lengths=(4, 40))


@pytest.fixture(scope="module")
def max_tokens(prompts):
    return [5 + (3 * i) % 11 for i in range(len(prompts))]     # the ranks' sequences end at other steps


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory):
    """Drafts mostly rejected."""
    return make_tiny_deepseek(tmp_path_factory.mktemp("spec-parallel") / "deepseek", seed=11)


@pytest.fixture(scope="module")
def copying_dir(tmp_path_factory):
    """Drafts mostly accepted (damped less than test_spec_mtp.py's, so that some are not): runs of up to K + 1
    tokens, chained MTP steps on every rank."""
    return make_copying_deepseek(tmp_path_factory.mktemp("spec-parallel") / "copying-deepseek", damp=0.8)


MTP = dict(method="mtp", num_speculative_tokens=2, max_num_batched_tokens=48)    # longer prompts in chunks


def greedy(artifact, prompts, max_tokens, drafts: list | None = None, **options) -> tuple[list[list[int]], dict | None]:
    """(each prompt's greedy tokens, the speculative counters' summary when speculating) from one batch; `drafts`
    (an in-process engine's) gets every (known tokens, drafts) its proposer returns."""
    engine = LLMEngine(str(artifact), **ENGINE, **options)
    try:
        if drafts is not None:
            record_drafts(engine.core.runner.proposer, drafts)
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
        tokens = [out["token_ids"] for out in engine.generate(prompts, params)]
        return tokens, engine.print_mtp_statistics() if "method" in options else None
    finally:
        engine.close()


def record_drafts(proposer, seen: list) -> None:
    propose = proposer.propose

    def recording(seqs, limits):
        drafts = propose(seqs, limits)
        seen.extend((tuple(seq.token_ids), tuple(d)) for seq, d in zip(seqs, drafts))
        return drafts
    proposer.propose = recording


def model(which: str, random_dir, copying_dir):
    return random_dir if which == "random" else copying_dir


@pytest.mark.parametrize("which", ["random", "copying"])
def test_mtp_over_tensor_parallel_ranks_proposes_and_decodes_as_one_rank(which, random_dir, copying_dir, prompts,
                                                                          max_tokens, build_artifact):
    """Every draft equals one rank's (rank 1's shard of the MTP layer reads rank 0's hidden states: on others its
    part of the attention and the experts would differ, and so would the drafts of the random model)."""
    model_dir = model(which, random_dir, copying_dir)
    one_rank = build_artifact(model_dir, compile="none")
    expected, _ = greedy(one_rank, prompts, max_tokens)
    expected_drafts, drafts = [], []
    _, expected_stats = greedy(one_rank, prompts, max_tokens, expected_drafts, **MTP)
    tp2 = build_artifact(model_dir, compile="none", tensor_parallel_size=2)
    got, stats = greedy(tp2, prompts, max_tokens, drafts, **MTP)
    assert got == expected
    assert drafts == expected_drafts and len(drafts) > 10
    assert stats == expected_stats


@pytest.mark.parametrize("which", ["random", "copying"])
def test_mtp_over_data_parallel_ranks_decodes_as_one_rank(which, random_dir, copying_dir, prompts, max_tokens,
                                                          build_artifact):
    """The ranks split the prompts, step in other sizes and end at other steps (padding-only MTP steps); each
    sequence's drafts are the MTP layer's as on one rank, so the acceptance counts equal one rank's."""
    model_dir = model(which, random_dir, copying_dir)
    one_rank = build_artifact(model_dir, compile="none")
    expected, _ = greedy(one_rank, prompts, max_tokens)
    _, expected_stats = greedy(one_rank, prompts, max_tokens, **MTP)
    dp2 = build_artifact(model_dir, compile="none", data_parallel_size=2, enable_expert_parallel=True)
    got, stats = greedy(dp2, prompts, max_tokens, **MTP)
    assert got == expected
    assert stats == expected_stats and stats["proposed_total"] > 0
    if which == "copying":
        assert 0 < stats["accepted_total"] < stats["proposed_total"]


def test_ngram_over_data_parallel_ranks_equals_one_rank(copying_dir, prompts, max_tokens, build_artifact):
    """The copying model repeats its prompt's last token, so the n-gram proposer finds drafts that verify."""
    expected, _ = greedy(build_artifact(copying_dir, compile="none"), prompts, max_tokens)
    artifact = build_artifact(copying_dir, compile="none", data_parallel_size=2, enable_expert_parallel=True)
    got, stats = greedy(artifact, prompts, max_tokens, method="ngram", num_speculative_tokens=3)
    assert got == expected
    assert stats["accepted_total"] > 0


class FakeMTP:
    """Records the row counts it is called with; returns logits [N, 3] and hidden [T, 2] as the package does."""

    def __init__(self):
        self.rows: list[int] = []

    def __call__(self, inputs, previous):
        self.rows.append(inputs.input_ids.shape[0])
        assert previous.shape == (inputs.input_ids.shape[0], 2)
        return torch.zeros(inputs.logits_indices.shape[0], 3), previous + 1


def aligned(monkeypatch, others: list[int], calls_per_step: int = 2) -> tuple[AlignedMTP, FakeMTP]:
    """An AlignedMTP whose other rank's row counts, call by call, are `others`."""
    counts = iter(others)
    monkeypatch.setattr(attention_dp, "agree", lambda values, group: [max(values[0], next(counts))])
    mtp = FakeMTP()
    return AlignedMTP(mtp, None, torch.zeros(2, 1, 1), 2, torch.float32, calls_per_step), mtp


def mtp_rows(n: int):
    from atom_aot.runtime.parallel.attention_dp import padding_only
    inputs = padding_only(torch.zeros(2, 1, 1), n)
    return inputs._replace(logits_indices=torch.arange(n)), torch.randn(n, 2)


def test_an_mtp_call_pads_to_the_other_ranks_rows_and_returns_only_its_own(monkeypatch):
    step, mtp = aligned(monkeypatch, others=[5, 0])
    inputs, previous = mtp_rows(3)
    logits, hidden = step(inputs, previous)
    assert mtp.rows == [5] and logits.shape == (3, 3) and torch.equal(hidden, previous + 1)
    step.finish_step()                     # the second call of the step: no rank has rows, nothing runs
    assert mtp.rows == [5] and step.calls == 0


def test_a_rank_without_mtp_rows_makes_up_the_steps_calls_with_padding(monkeypatch):
    step, mtp = aligned(monkeypatch, others=[4, 2])
    step.finish_step()
    assert mtp.rows == [4, 2] and step.calls == 0


def test_more_mtp_calls_than_a_step_has_are_refused(monkeypatch):
    step, _ = aligned(monkeypatch, others=[1, 1, 1], calls_per_step=2)
    inputs, previous = mtp_rows(1)
    step(inputs, previous)
    step(inputs, previous)
    with pytest.raises(RuntimeError, match="more than 2 calls in one engine step"):
        step(inputs, previous)
