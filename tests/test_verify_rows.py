"""Verify steps as decode rows (runtime/spec/verify_rows.py) on the CPU: each query row of a verify batch becomes a
one-token sequence over its owner's block table with seq_len = its position + 1; through the real tiny Llama
and DeepSeek models (eager, and through decode graphs replayed as plain calls) the rows' logits, hidden states
and written KV equal the mixed forward's over the batch as it is; greedy outputs with speculation through
them equal decoding without speculation, on one rank and on two tensor-parallel ranks; the route's choice."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from runner_factories import make_runner

from atom_aot import LLMEngine, SamplingParams
from atom_aot.errors import StartupError
from atom_aot.runtime.execution.cuda_graphs import DecodeGraphs
from atom_aot.runtime.spec.setup import VERIFY_ROUTE_VARIABLE
from atom_aot.runtime.spec.verify_rows import DecodeRowsVerify, as_decode_rows
from deepseek_factories import make_tiny_deepseek
from factories import random_prompts
from test_verify_graphs import outputs_and_written_kv, real_verify_inputs, verify_batch

K = 3
COUNTS = [4, 1, 3]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def copying_prompts(n: int = 5) -> list[list[int]]:
    """Prompts whose tails repeat their heads: prompt lookup finds drafts, some of them accepted."""
    return [p + p[:12] for p in random_prompts(n, 300, seed=3, lengths=(6, 30))]


def test_each_row_is_a_sequence_of_its_own_over_its_owners_block_table():
    inputs = verify_batch(make_runner(), COUNTS)
    rows = as_decode_rows(inputs, COUNTS)
    owner = np.repeat(np.arange(len(COUNTS)), COUNTS)
    assert torch.equal(rows.block_tables, inputs.block_tables[owner])
    assert rows.seq_lens.dtype == inputs.seq_lens.dtype
    assert rows.seq_lens.tolist() == (inputs.positions + 1).tolist()
    assert rows.seq_lens[np.cumsum(COUNTS) - 1].tolist() == inputs.seq_lens.tolist()   # each last row: the whole context
    assert rows.query_start_loc.tolist() == list(range(sum(COUNTS) + 1))
    assert rows.logits_indices.tolist() == list(range(sum(COUNTS)))
    for name in ("input_ids", "positions", "slot_mapping"):
        assert torch.equal(getattr(rows, name), getattr(inputs, name))
    assert rows.kv_cache is inputs.kv_cache


def test_counts_that_do_not_match_the_batch_are_refused():
    inputs = verify_batch(make_runner(), COUNTS)
    with pytest.raises(ValueError, match=r"3 sequences and 8 rows cannot have \[4, 1, 2\]"):
        as_decode_rows(inputs, [4, 1, 2])


def test_batches_of_more_rows_than_the_graphs_hold_run_the_mixed_forward():
    seen = []
    verify = DecodeRowsVerify(lambda inputs: seen.append(("decode", inputs)), 5,
                              lambda inputs: seen.append(("mixed", inputs)))
    runner = make_runner()
    small, large = verify_batch(runner, [4, 1]), verify_batch(runner, COUNTS)
    verify(small, [4, 1])
    verify(large, COUNTS)
    assert [route for route, _ in seen] == ["decode", "mixed"]
    assert seen[0][1].block_tables.shape[0] == 5 and seen[1][1] is large


@pytest.fixture(scope="module")
def deepseek_artifact(tmp_path_factory, build_artifact) -> str:
    return str(build_artifact(make_tiny_deepseek(tmp_path_factory.mktemp("models") / "tiny-deepseek-rows", seed=12),
                              compile="none"))


@pytest.mark.parametrize("family", ["llama", "deepseek"])
def test_the_rows_give_the_mixed_forwards_logits_hidden_states_and_kv(family, tiny_llama_eager_artifact,
                                                                      deepseek_artifact):
    """The real tiny models' logits and hidden states at every row, and the KV cache they leave, against
    the mixed forward over the verify batch as it is; the same through decode graphs (plain calls)."""
    artifact = str(tiny_llama_eager_artifact) if family == "llama" else deepseek_artifact
    engine = LLMEngine(artifact, num_kv_blocks=64, max_model_len=256)
    runner = engine.core.runner
    both = runner.forwards.mixed.logits_and_hidden
    inputs = real_verify_inputs(runner, COUNTS, seed=1)
    (logits, hidden), expected_kv = outputs_and_written_kv(both, inputs)
    max_blocks = -(-engine.core.scheduler.config.max_model_len // runner.block_size)
    graphs = DecodeGraphs(both, runner.kv_cache, (2, 16), max_blocks)
    graphs.capture(record=lambda call: call)
    for decode, bound in ((both, None), (graphs.logits_and_hidden, graphs.max_batch_size)):
        (rows_logits, rows_hidden), written = outputs_and_written_kv(DecodeRowsVerify(decode, bound, both), inputs,
                                                                      COUNTS)
        assert rows_logits.shape == logits.shape == (sum(COUNTS), logits.shape[1])
        torch.testing.assert_close(rows_logits, logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(rows_hidden, hidden, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(written, expected_kv, rtol=0, atol=1e-5)


def test_greedy_outputs_through_decode_rows_equal_decoding_without_speculation(tiny_llama_eager_artifact,
                                                                              monkeypatch, caplog):
    monkeypatch.setenv(VERIFY_ROUTE_VARIABLE, "decode-rows")
    with caplog.at_level(logging.INFO, logger="atom_aot"):
        engine = LLMEngine(str(tiny_llama_eager_artifact), method="ngram", num_speculative_tokens=K)
    assert ("verify steps: the mixed package, one decode row per query token (ATOM_VERIFY_ROUTE=decode-rows)"
            in caplog.text)
    prompts = copying_prompts()
    expected = [o["token_ids"] for o in LLMEngine(str(tiny_llama_eager_artifact)).generate(prompts, GREEDY)]
    assert [o["token_ids"] for o in engine.generate(prompts, GREEDY)] == expected
    assert engine.print_mtp_statistics()["accepted_total"] > 0


def test_mla_models_verify_as_decode_rows_and_other_models_through_the_mixed_package(
        tiny_llama_eager_artifact, deepseek_artifact, caplog):
    with caplog.at_level(logging.INFO, logger="atom_aot"):
        LLMEngine(deepseek_artifact, method="ngram", num_speculative_tokens=K)
    assert ("one decode row per query token (the mixed package's MLA is the reference op, which reads the batch "
            "layout on the host)") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="atom_aot"):
        LLMEngine(str(tiny_llama_eager_artifact), method="ngram", num_speculative_tokens=K)
    assert "verify steps: the mixed package, no CUDA graphs (not a CUDA device)" in caplog.text


def test_an_unknown_route_is_refused_by_name(tiny_llama_eager_artifact, monkeypatch):
    monkeypatch.setenv(VERIFY_ROUTE_VARIABLE, "rows")
    with pytest.raises(StartupError, match=r"ATOM_VERIFY_ROUTE='rows': use one of auto, decode-rows, mixed"):
        LLMEngine(str(tiny_llama_eager_artifact), method="ngram", num_speculative_tokens=K)


def test_two_tensor_parallel_ranks_verify_decode_rows_as_one_rank_decodes(build_artifact, tiny_llama_dir,
                                                                         monkeypatch):
    """Rank 0 sends each verify step's rows to rank 1 (forked) as it sends any step."""
    monkeypatch.setenv(VERIFY_ROUTE_VARIABLE, "decode-rows")
    prompts = copying_prompts(3)
    expected = [o["token_ids"] for o in LLMEngine(str(build_artifact(tiny_llama_dir, compile="none")),
                                                  num_kv_blocks=64, num_threads=1).generate(prompts, GREEDY)]
    engine = LLMEngine(str(build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2)), num_kv_blocks=64,
                       num_threads=1,
                       method="ngram", num_speculative_tokens=K)
    try:
        assert [o["token_ids"] for o in engine.generate(prompts, GREEDY)] == expected
        assert engine.print_mtp_statistics()["accepted_total"] > 0
    finally:
        engine.close()


@pytest.mark.parametrize("mla,route", [(None, "mixed"), ("reference", "decode-rows"), ("triton", "decode-rows")])
def test_the_route_by_the_artifacts_mixed_row(monkeypatch, mla, route):
    """`auto`: the mixed package's verify graphs, except for MLA models, whose verify tokens go through the decode
    kernel as decode rows whatever their mixed row (with the reference op the package cannot be captured; the
    triton mixed path's graphs are not measured against decode rows)."""
    from types import SimpleNamespace
    from atom_aot.artifact.phase import Phase
    from atom_aot.artifact.tuning import BackendChoice, PhaseTuning, Tuning
    from atom_aot.runtime.spec.setup import verify_route
    monkeypatch.delenv(VERIFY_ROUTE_VARIABLE, raising=False)
    ops = {"attention": BackendChoice("triton")} if mla is None else {"mla_attention": BackendChoice(mla)}
    loaded = SimpleNamespace(tuning=Tuning("sm90", True, {Phase.MIXED: PhaseTuning(ops)}))
    assert verify_route(loaded)[0] == route
