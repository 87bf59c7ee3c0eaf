"""DecodeGraphs' staging on the CPU: a decode batch of n sequences is copied into the static
buffers of the smallest capture size >= n, rows n .. size are padding (slot -1, seq_len 1), and
the output is trimmed to n rows. A fake forward stands in for the package, and each "graph"
replays it as a plain call."""
import pytest
import torch

from runner_factories import make_batch, make_runner, make_sequence

from atom_aot.models.step_inputs import StepInputs
from atom_aot.runtime.execution.cuda_graphs import DecodeGraphs
from atom_aot.runtime.execution.forwards import Forwards

SIZES = (1, 2, 4, 8)
MAX_BLOCKS = 3


class EchoForward:
    """Returns one row per sequence of the static inputs it is given: [id, position, slot, seq_len]."""

    def __init__(self):
        self.seen: list[StepInputs] = []

    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        self.seen.append(StepInputs(*(t.clone() for t in inputs)))
        columns = (inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.seq_lens)
        return torch.stack([c.float() for c in columns], dim=-1)[inputs.logits_indices]


def decode_inputs(runner, num_seqs: int, first_token: int = 100):
    lengths = [3 + i % 3 for i in range(num_seqs)]
    seqs = [make_sequence([first_token + i] * n, block_table=[i, i + 8], num_computed_tokens=n - 1,
                          num_prompt_tokens=2) for i, n in enumerate(lengths)]
    inputs, _ = runner.prepare_inputs(make_batch(*((s, 1) for s in seqs)))
    return inputs


@pytest.fixture
def setup():
    runner, forward = make_runner(), EchoForward()
    graphs = DecodeGraphs(forward, runner.kv_cache, SIZES, MAX_BLOCKS)
    recorded = []
    graphs.capture(record=lambda call: recorded.append(call.args[0]) or call)   # a "graph" that calls again
    forward.seen.clear()
    return runner, forward, graphs, recorded


def test_captures_every_size_largest_first(setup):
    *_, graphs, recorded = setup
    assert recorded == [8, 4, 2, 1] and graphs.max_batch_size == 8


@pytest.mark.parametrize("n,size", [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)])
def test_runs_the_smallest_size_that_holds_the_batch(setup, n, size):
    runner, forward, graphs, _ = setup
    out = graphs(decode_inputs(runner, n))
    (seen,) = forward.seen
    assert seen.input_ids.shape[0] == size and seen.block_tables.shape == (size, MAX_BLOCKS)
    assert seen.query_start_loc.tolist() == list(range(size + 1))
    assert seen.logits_indices.tolist() == list(range(size))
    assert out.shape == (n, 4)


def test_real_rows_are_copied_and_padding_rows_are_harmless(setup):
    runner, forward, graphs, _ = setup
    graphs(decode_inputs(runner, 4, first_token=50))     # leaves rows 0..3 filled
    inputs = decode_inputs(runner, 3)
    out = graphs(inputs)
    seen = forward.seen[-1]
    assert torch.equal(seen.input_ids[:3], inputs.input_ids)
    assert torch.equal(seen.block_tables[:3, :inputs.block_tables.shape[1]], inputs.block_tables)
    assert seen.slot_mapping[3:].tolist() == [-1] and seen.seq_lens[3:].tolist() == [1]
    expected = torch.stack([inputs.input_ids, inputs.positions, inputs.slot_mapping, inputs.seq_lens], -1).float()
    assert torch.equal(out, expected)


def test_refuses_another_kv_cache(setup):
    runner, _, graphs, _ = setup
    inputs = decode_inputs(runner, 2)._replace(kv_cache=runner.kv_cache.clone())
    with pytest.raises(ValueError, match="another KV cache"):
        graphs(inputs)


def test_runner_sends_decode_batches_that_fit_through_the_graphs(setup):
    runner, forward, graphs, _ = setup
    mixed = EchoForward()
    runner.forwards = Forwards(mixed, graphs, decode_max_seqs=graphs.max_batch_size)
    seqs = [make_sequence([7] * 4, block_table=[i], num_computed_tokens=3, num_prompt_tokens=2) for i in range(9)]
    runner.run(make_batch(*((s, 1) for s in seqs[:3])))
    runner.run(make_batch(*((s, 1) for s in seqs)))
    assert [s.input_ids.shape[0] for s in forward.seen] == [4]
    assert [s.input_ids.shape[0] for s in mixed.seen] == [9]
