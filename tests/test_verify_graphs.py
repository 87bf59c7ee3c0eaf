"""VerifyGraphs (runtime/spec/verify_graphs.py) on the CPU: a verify batch of n sequences with 1..K+1 query
tokens each is laid out K+1 rows per sequence in the static buffers of the smallest capture size >= n
(padding rows write nothing, and attention of the real rows is unchanged), and the outputs come back at
the real rows. The "graphs" replay as plain calls; the GPU capture itself is not run here. End to end:
greedy outputs with speculation through the verify graphs equal decoding without speculation."""
from __future__ import annotations

import logging

import pytest
import torch

from runner_factories import make_batch, make_runner, make_sequence

from atom_aot import LLMEngine, SamplingParams
from atom_aot.models.step_inputs import StepInputs
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.scheduling.sequence import Sequence, SequenceStatus
from atom_aot.runtime.spec.verify_graphs import VerifyGraphs, verify_capture_sizes
import atom_aot.runtime.execution.cuda_graphs as cuda_graphs_module
import atom_aot.runtime.spec.setup as spec_setup
from factories import random_prompts

K = 3
SIZES = (1, 2, 4)


class EchoRows:
    """One output row per token row of the static inputs: [id, position, slot, its sequence's seq_len]."""

    def __init__(self):
        self.seen: list[StepInputs] = []

    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        self.seen.append(StepInputs(*(t.clone() for t in inputs)))
        seq_of_row = torch.searchsorted(inputs.query_start_loc[1:], torch.arange(inputs.input_ids.shape[0]), right=True)
        columns = (inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.seq_lens[seq_of_row])
        return torch.stack([c.float() for c in columns], dim=-1)


def verify_batch(runner, counts: list[int], first_token: int = 100):
    """Sequences whose newest token and counts[i] - 1 drafts are computed this step."""
    seqs = []
    for i, count in enumerate(counts):
        known = 5 + i
        seq = make_sequence([first_token + i] * (known + count - 1), block_table=[2 * i, 2 * i + 1, 2 * i + 8],
                            num_computed_tokens=known - 1, num_prompt_tokens=3, request_id=f"r{i}")
        seqs.append((seq, count))
    batch = make_batch(*seqs)
    inputs, _ = runner.prepare_inputs(batch)
    return inputs


def graphs_for(forward, runner, sizes=SIZES, max_blocks: int = 3) -> VerifyGraphs:
    graphs = VerifyGraphs(forward, runner.kv_cache, sizes, K, max_blocks, runner.block_size)
    graphs.capture(record=lambda call: call)
    return graphs


def test_capture_sizes_hold_k_plus_one_rows_within_the_token_bound():
    assert verify_capture_sizes((1, 2, 4, 8, 256), 3, max_tokens=32) == (1, 2, 4, 8)
    assert verify_capture_sizes((4, 1), 0, max_tokens=4) == (1, 4)


@pytest.mark.parametrize("counts,size", [([4], 1), ([1, 4], 2), ([2, 1, 3], 4), ([4, 4, 4, 4], 4)])
def test_real_rows_are_laid_out_k_plus_one_per_sequence(counts, size):
    runner, forward = make_runner(), EchoRows()
    graphs = graphs_for(forward, runner)
    inputs = verify_batch(runner, counts)
    forward.seen.clear()
    out = graphs(inputs, counts)
    (seen,) = forward.seen
    rows = K + 1
    assert seen.input_ids.shape[0] == size * rows and seen.block_tables.shape[0] == size
    assert seen.query_start_loc.tolist() == list(range(0, (size + 1) * rows, rows))
    start = 0
    for i, count in enumerate(counts):
        mine = slice(i * rows, i * rows + count)
        assert torch.equal(seen.input_ids[mine], inputs.input_ids[start:start + count])
        assert torch.equal(seen.positions[mine], inputs.positions[start:start + count])
        assert torch.equal(seen.slot_mapping[mine], inputs.slot_mapping[start:start + count])
        pads = slice(i * rows + count, (i + 1) * rows)
        assert (seen.slot_mapping[pads] == -1).all()
        assert (seen.positions[pads] == inputs.positions[start + count - 1]).all()
        assert int(seen.seq_lens[i]) == int(inputs.seq_lens[i]) + rows - count     # context + K + 1
        start += count
    assert (seen.slot_mapping[len(counts) * rows:] == -1).all() and (seen.seq_lens[len(counts):] == rows).all()
    real = torch.stack([inputs.input_ids, inputs.positions, inputs.slot_mapping,
                        torch.repeat_interleave(inputs.seq_lens + rows - torch.tensor(counts), torch.tensor(counts))],
                       dim=-1).float()
    assert torch.equal(out, real)


def test_refuses_a_count_past_k_plus_one_and_another_cache():
    runner = make_runner()
    graphs = graphs_for(EchoRows(), runner)
    with pytest.raises(ValueError, match="rows per sequence must be 1..4"):
        graphs(verify_batch(runner, [5]), [5])
    inputs = verify_batch(runner, [2])._replace(kv_cache=runner.kv_cache.clone())
    with pytest.raises(ValueError, match="another KV cache"):
        graphs(inputs, [2])


@pytest.fixture(scope="module")
def target(tiny_llama_eager_artifact):
    return str(tiny_llama_eager_artifact)


@pytest.fixture
def cpu_verify_graphs(monkeypatch):
    """start_verify_graphs as on a GPU, with plain calls for graphs and capture sizes 1, 2, 4."""
    monkeypatch.setattr(spec_setup, "no_verify_graphs_reason", lambda *args: None)
    monkeypatch.setattr(spec_setup, "verify_capture_sizes", lambda sizes, k: SIZES)
    monkeypatch.setattr(cuda_graphs_module, "CudaGraphRecorder", lambda: (lambda call: call))


def real_verify_inputs(runner, counts: list[int], seed: int = 0) -> StepInputs:
    """A verify step of a real engine's runner: sequence i (contexts 19, 26, ... of random tokens, its own
    blocks) computes its newest token and counts[i] - 1 random drafts; the KV cache is filled with random
    values first (the contexts' keys)."""
    g = torch.Generator().manual_seed(seed)
    runner.kv_cache.copy_(torch.randn(runner.kv_cache.shape, generator=g))
    seqs, drafts = [], []
    for i, count in enumerate(counts):
        context = 19 + 7 * i                 # computed; the newest token and count - 1 drafts are this step's
        blocks = [3 * i + 1, 3 * i + 2, 3 * i + 3]
        assert len(blocks) * runner.block_size >= context + count
        seqs.append(Sequence(request_id=f"s{i}", token_ids=torch.randint(3, 200, (context + 1,), generator=g).tolist(),
                             num_prompt_tokens=context, params=SamplingParams(temperature=0), block_size=runner.block_size,
                             status=SequenceStatus.RUNNING, num_computed_tokens=context, block_table=blocks))
        drafts.append(tuple(torch.randint(3, 200, (count - 1,), generator=g).tolist()))
    batch = ScheduledBatch.of(tuple(seqs), tuple(counts), False, draft_token_ids=tuple(drafts))
    return runner.prepare_inputs(batch)[0]


def outputs_and_written_kv(forward, inputs: StepInputs, *args):
    """forward(inputs, *args) and the KV cache it leaves; the cache is then put back as it was."""
    before = inputs.kv_cache.clone()
    out = forward(inputs, *args)
    written = inputs.kv_cache.clone()
    inputs.kv_cache.copy_(before)
    return out, written


def test_the_mixed_model_sees_the_same_real_rows(target):
    """The real tiny model's logits at the real rows and the KV it writes, padded and not."""
    engine = LLMEngine(target, num_kv_blocks=64, max_model_len=256)
    runner = engine.core.runner
    mixed = runner.forwards.mixed
    graphs = graphs_for(mixed, runner, max_blocks=-(-engine.core.scheduler.config.max_model_len // runner.block_size))
    counts = [4, 1, 3]
    inputs = real_verify_inputs(runner, counts)
    padded, written = outputs_and_written_kv(graphs, inputs, counts)
    plain, expected = outputs_and_written_kv(mixed, inputs)
    assert padded.shape == plain.shape == (sum(counts), plain.shape[1])
    torch.testing.assert_close(padded, plain, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(written, expected, rtol=0, atol=1e-5)


def test_greedy_outputs_through_verify_graphs_equal_decoding_without_speculation(target, cpu_verify_graphs, caplog):
    prompts = [p + p[:12] for p in random_prompts(5, 300, seed=3, lengths=(6, 30))]   # prompt lookup finds copies
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    with caplog.at_level(logging.INFO, logger="atom_aot"):
        engine = LLMEngine(target, method="ngram", num_speculative_tokens=K)
    assert "verify steps: CUDA graphs of the mixed package at 4 rows per sequence, 3 sizes up to 4" in caplog.text
    expected = [o["token_ids"] for o in LLMEngine(target).generate(prompts, greedy)]
    assert [o["token_ids"] for o in engine.generate(prompts, greedy)] == expected     # 5 prompts: one batch past 4
    assert engine.print_mtp_statistics()["accepted_total"] > 0


def test_cpu_engines_say_verify_steps_run_the_package(target, caplog):
    with caplog.at_level(logging.INFO, logger="atom_aot"):
        LLMEngine(target, method="ngram", num_speculative_tokens=K)
    assert "verify steps: the mixed package, no CUDA graphs (not a CUDA device)" in caplog.text


def test_a_capture_that_fails_leaves_verify_steps_to_the_package_and_says_so(target, cpu_verify_graphs,
                                                                            monkeypatch, caplog):
    def failing():
        def record(call):
            raise RuntimeError("operation not permitted when stream is capturing")
        return record
    monkeypatch.setattr(cuda_graphs_module, "CudaGraphRecorder", failing)
    with caplog.at_level(logging.INFO, logger="atom_aot"):
        engine = LLMEngine(target, method="ngram", num_speculative_tokens=K)
    assert "capturing it at 4 rows per sequence failed: operation not permitted" in caplog.text
    out = engine.generate([[5, 6, 7, 5, 6, 7, 5, 6]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert len(out[0]["token_ids"]) == 6
