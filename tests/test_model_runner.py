"""ModelRunner on the CPU with fake forwards: the step inputs it builds from a scheduled batch, the
logits rows it samples and scores, and which forward (mixed or decode) runs each batch."""
import numpy as np
import pytest
import torch

from runner_factories import VOCAB, RecordingForward, make_batch, make_runner, make_sequence

from atom_aot.artifact.signature import INPUT_NAMES
from atom_aot.models.step_inputs import input_dtype
from atom_aot.runtime.execution.forwards import Forwards
from atom_aot.runtime.sampling.sampling_rows import SamplingBatch
from atom_aot.runtime.sampling_params import SamplingParams


def as_lists(inputs):
    return {name: getattr(inputs, name).tolist() for name in INPUT_NAMES if name != "kv_cache"}


class TestPrepareInputs:
    """Block size 4: token t of a sequence goes to slot block_table[t // 4] * 4 + t % 4."""

    def test_two_prompts_from_the_start(self):
        a = make_sequence([10, 11, 12, 13, 14], block_table=[7, 2])
        b = make_sequence([20, 21, 22], block_table=[5])
        runner = make_runner()
        inputs, rows = runner.prepare_inputs(make_batch((a, 5), (b, 3)))
        assert as_lists(inputs) == {
            "input_ids": [10, 11, 12, 13, 14, 20, 21, 22],
            "positions": [0, 1, 2, 3, 4, 0, 1, 2],
            "slot_mapping": [28, 29, 30, 31, 8, 20, 21, 22],
            "block_tables": [[7, 2], [5, 0]],
            "seq_lens": [5, 3],
            "query_start_loc": [0, 5, 8],
            "logits_indices": [4, 7],          # each prompt's last token samples
        }
        assert inputs.kv_cache is runner.kv_cache
        assert rows.sample_rows == [0, 1] and rows.prompt_rows == {}

    def test_dtypes_follow_the_signature(self):
        inputs, _ = make_runner().prepare_inputs(make_batch((make_sequence([1, 2], [0]), 2)))
        for name in INPUT_NAMES:
            assert getattr(inputs, name).dtype == input_dtype(name, torch.float32), name

    def test_chunked_prefill_continues_from_num_computed_tokens(self):
        prompt = list(range(40, 50))                                  # 10 tokens, 4 already in the cache
        chunk = make_sequence(prompt, block_table=[3, 9, 4], num_computed_tokens=4)
        decoding = make_sequence([5, 6, 7, 8, 9], block_table=[1, 6], num_computed_tokens=4, num_prompt_tokens=3)
        inputs, rows = make_runner().prepare_inputs(make_batch((chunk, 3), (decoding, 1)))
        assert as_lists(inputs) == {
            "input_ids": [44, 45, 46, 9],
            "positions": [4, 5, 6, 4],
            "slot_mapping": [36, 37, 38, 24],
            "block_tables": [[3, 9, 4], [1, 6, 0]],
            "seq_lens": [7, 5],
            "query_start_loc": [0, 3, 4],
            "logits_indices": [3],              # the chunk stops short of its prompt's end: no sample
        }
        assert rows.sample_rows == [0] and rows.prompt_rows == {}

    def test_decode_batch_samples_every_sequence(self):
        seqs = [make_sequence(list(range(n)), block_table=[2 * i, 2 * i + 1], num_computed_tokens=n - 1,
                              num_prompt_tokens=2) for i, n in enumerate((3, 6, 8))]
        inputs, rows = make_runner().prepare_inputs(make_batch(*((s, 1) for s in seqs)))
        assert inputs.positions.tolist() == [2, 5, 7]
        assert inputs.slot_mapping.tolist() == [0 * 4 + 2, 3 * 4 + 1, 5 * 4 + 3]
        assert inputs.logits_indices.tolist() == [0, 1, 2] and rows.sample_rows == [0, 1, 2]

    def test_prompt_logprob_rows_come_before_the_sample_row(self):
        plain = make_sequence([1, 2, 3], block_table=[0])
        scored = make_sequence([4, 5, 6, 7, 8, 9], block_table=[1, 2], prompt_logprobs=2)
        inputs, rows = make_runner().prepare_inputs(make_batch((plain, 3), (scored, 6)))
        # plain samples at its token row 2; scored's positions 0..4 score the next prompt token,
        # position 5 samples
        assert inputs.logits_indices.tolist() == [2, 3, 4, 5, 6, 7, 8]
        assert rows.sample_rows == [0, 6]
        assert rows.prompt_rows == {1: range(1, 6)}

    def test_prompt_logprobs_of_a_chunked_prompt(self):
        scored = make_sequence([4, 5, 6, 7, 8, 9], block_table=[1, 2], prompt_logprobs=0)
        inputs, rows = make_runner().prepare_inputs(make_batch((scored, 4)))
        assert inputs.logits_indices.tolist() == [0, 1, 2, 3]
        assert rows.sample_rows == [] and rows.prompt_rows == {0: range(0, 4)}
        scored.num_computed_tokens = 4
        inputs, rows = make_runner().prepare_inputs(make_batch((scored, 2)))
        assert inputs.logits_indices.tolist() == [0, 1]        # position 4 scores token 5; position 5 samples
        assert rows.sample_rows == [1] and rows.prompt_rows == {0: range(0, 1)}


class TestPersistentRows:
    """Block tables are kept between steps, a row per sequence holding blocks: a step copies only
    appended block ids, and a row is cleared when the scheduler reports the sequence's blocks freed."""

    def tables(self, runner, *scheduled, freed=()):
        inputs, _ = runner.prepare_inputs(make_batch(*scheduled, freed=freed))
        return inputs.block_tables.tolist()

    def test_a_growing_table_shows_its_new_blocks(self):
        runner = make_runner()
        seq = make_sequence([1, 2, 3, 4], block_table=[7], num_computed_tokens=3)
        assert self.tables(runner, (seq, 1)) == [[7]]
        seq.token_ids.append(5), seq.block_table.append(3)
        seq.num_computed_tokens = 4
        assert self.tables(runner, (seq, 1)) == [[7, 3]]

    def test_a_newcomer_in_a_finished_sequences_row_sees_none_of_its_blocks(self):
        runner = make_runner()
        done = make_sequence(list(range(12)), block_table=[4, 5, 6], num_computed_tokens=11)
        staying = make_sequence([1, 2, 3, 4, 5], block_table=[1, 2], num_computed_tokens=4)
        self.tables(runner, (done, 1), (staying, 1))
        done.block_table.clear()                                   # finished: the scheduler freed it
        newcomer = make_sequence([9, 9], block_table=[8])
        assert self.tables(runner, (newcomer, 2), (staying, 1), freed=(done,)) == [[8, 0], [1, 2]]

    def test_a_preempted_sequence_runs_again_with_its_new_blocks(self):
        runner = make_runner()
        seq = make_sequence([1, 2, 3, 4, 5], block_table=[3, 9], num_computed_tokens=4)
        self.tables(runner, (seq, 1))
        seq.block_table[:] = [6, 2]                               # freed and reallocated: same length
        seq.num_computed_tokens = 0
        assert self.tables(runner, (seq, 5), freed=(seq,)) == [[6, 2]]

    def test_a_table_that_shrinks_unreported_is_a_bug(self):
        runner = make_runner()
        seq = make_sequence([1, 2, 3, 4, 5], block_table=[3, 9], num_computed_tokens=4)
        self.tables(runner, (seq, 1))
        seq.block_table[:] = [6]
        seq.token_ids[:] = [1]
        seq.num_computed_tokens = 0
        with pytest.raises(RuntimeError, match="shrank from 2 to 1 blocks"):
            self.tables(runner, (seq, 1))

    def test_more_sequences_and_longer_tables_than_the_rows_hold_at_first(self):
        runner = make_runner(num_blocks=200)
        rows = runner.inputs.rows
        seqs = [make_sequence(list(range(4 * (i % 20) + 4)), block_table=list(range(i % 20 + 1)),
                              num_computed_tokens=4 * (i % 20) + 3) for i in range(rows.block_tables.shape[0] + 5)]
        tables = self.tables(runner, *((s, 1) for s in seqs))
        assert rows.block_tables.shape[0] >= len(seqs) and rows.block_tables.shape[1] >= 20
        assert tables == [s.block_table + [0] * (20 - len(s.block_table)) for s in seqs]


def with_params(token_ids: list[int], request_id: str, params: SamplingParams):
    """A sequence of `token_ids` (one block each of 4) sampling with `params`, none computed yet."""
    seq = make_sequence(token_ids, block_table=list(range(-(-len(token_ids) // 4))), request_id=request_id)
    seq.params = params
    return seq


class TestPersistentSamplingRows:
    """Each row's sampling parameters are written when its sequence gets the row and cleared when the sequence
    leaves; a step gathers the rows of its sampling sequences, in batch order."""

    def test_a_step_gathers_its_sequences_parameters_in_batch_order(self):
        runner = make_runner()
        hot = with_params([1, 2, 3], "hot", SamplingParams(temperature=0.7, top_k=5))
        greedy = with_params([4, 5], "greedy", SamplingParams(temperature=0))
        runner.prepare_inputs(make_batch((hot, 3), (greedy, 2)))
        batch = runner.inputs.sampling_batch()
        assert batch.temperature.tolist() == pytest.approx([0.7, 1.0]) and batch.top_k.tolist() == [5, -1]
        assert batch.greedy.tolist() == [False, True] and batch.masks.tolist() == [True, False]
        assert same(batch, SamplingBatch.of([hot.params, greedy.params]))
        runner.prepare_inputs(make_batch((greedy, 2), (hot, 3)))
        assert runner.inputs.sampling_batch().greedy.tolist() == [True, False]

    def test_a_row_a_sequence_left_is_cleared_for_the_next(self):
        runner = make_runner()
        rows = runner.inputs.rows
        penalized = with_params([1, 2], "p", SamplingParams(repetition_penalty=1.2, top_p=0.5))
        runner.prepare_inputs(make_batch((penalized, 2)))
        row = int(rows.rows_for([penalized])[0][0])
        assert rows.sampling.processes[row] and rows.sampling.masks[row]
        rows.release([penalized])
        assert not rows.sampling.processes[row] and rows.sampling.top_p[row] == 1.0
        newcomer = with_params([3], "n", SamplingParams(temperature=0))
        runner.prepare_inputs(make_batch((newcomer, 1)))
        assert runner.inputs.sampling_batch().greedy.tolist() == [True]

    def test_rows_added_past_the_first_ones_get_their_parameters(self):
        runner = make_runner(num_blocks=200)
        count = runner.inputs.rows.block_tables.shape[0] + 3
        seqs = [with_params([i + 1], str(i), SamplingParams(temperature=0.1 * (i % 9 + 1))) for i in range(count)]
        runner.prepare_inputs(make_batch(*((s, 1) for s in seqs)))
        assert runner.inputs.sampling_batch().temperature.tolist() == pytest.approx(
            [s.params.temperature for s in seqs])


def same(a: SamplingBatch, b: SamplingBatch) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)


class TestRun:
    def test_samples_the_last_token_of_each_finishing_sequence(self):
        chunk = make_sequence(list(range(10, 20)), block_table=[3, 9, 4], num_computed_tokens=4)
        prompt = make_sequence([3, 7, 30], block_table=[5], prompt_logprobs=1)
        out = make_runner().run(make_batch((chunk, 3), (prompt, 3)))
        assert out.sampled == [None, (30 + 1) % VOCAB]
        assert out.prompt_logprobs[0] is None
        # positions 0 and 1 score the prompt's next tokens, with one alternative each
        assert [lp.token_id for lp in out.prompt_logprobs[1]] == [7, 30]
        assert [len(lp.top) for lp in out.prompt_logprobs[1]] == [1, 1]


class TestForwards:
    def setup_method(self):
        self.mixed, self.decode = RecordingForward(), RecordingForward()

    def decode_batch(self, num_seqs: int):
        return make_batch(*((make_sequence([1, 2, 3], [i], num_computed_tokens=2), 1) for i in range(num_seqs)))

    def test_prefill_runs_mixed(self):
        forwards = Forwards(self.mixed, self.decode, decode_max_seqs=8)
        assert forwards.for_batch(make_batch((make_sequence([1, 2, 3], [0]), 3))) is self.mixed

    def test_decode_runs_decode_when_it_fits(self):
        forwards = Forwards(self.mixed, self.decode, decode_max_seqs=4)
        assert forwards.for_batch(self.decode_batch(4)) is self.decode
        assert forwards.for_batch(self.decode_batch(5)) is self.mixed

    def test_decode_without_a_limit_or_without_a_decode_forward(self):
        assert Forwards(self.mixed, self.decode).for_batch(self.decode_batch(9)) is self.decode
        assert Forwards(self.mixed).for_batch(self.decode_batch(1)) is self.mixed

    def test_runner_calls_the_chosen_forward(self):
        runner = make_runner(Forwards(self.mixed, self.decode, decode_max_seqs=2))
        runner.run(self.decode_batch(2))
        runner.run(self.decode_batch(3))
        assert [len(c.input_ids) for c in self.decode.calls] == [2]
        assert [len(c.input_ids) for c in self.mixed.calls] == [3]
