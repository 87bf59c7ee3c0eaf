"""Speculative decoding in the scheduler (plain Python, no model): the n-gram proposer, the drafts the runner
hands over read into verify steps, slots for them and past them, the accepted run appended up to its first stop,
and the block accounting after it."""
from __future__ import annotations

import pytest

from atom_aot.runtime.scheduling.scheduler import SpeculationShape, draft_limit
from atom_aot.runtime.spec.ngram import NgramProposer, propose_ngram
from engine_factories import EOS, make_scheduler, make_seq


class TestNgram:
    @pytest.mark.parametrize("tokens, k, expected", [
        ([1, 2, 3, 4, 5, 1, 2, 3], 3, [4, 5, 1]),      # the 3-gram 1 2 3 recurs
        ([1, 2, 3, 4, 5, 1, 2, 3], 1, [4]),
        ([7, 1, 2, 9, 1, 2, 8, 1, 2], 2, [8, 1]),      # the latest occurrence wins
        ([5, 6, 5, 6, 5, 6], 4, [5, 6]),               # a match near the end gives what follows it
        ([1, 2, 3, 4], 3, []),                          # nothing recurs
        ([1, 2, 3, 9, 3], 3, []),                       # a 1-gram is below min_n = 2
    ])
    def test_longest_recurring_suffix(self, tokens, k, expected):
        assert propose_ngram(tokens, k, min_n=2, max_n=4) == expected

    def test_longer_suffixes_are_tried_first(self):
        tokens = [1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3]      # 2 3 -> 8 (latest), but 1 2 3 -> 7
        assert propose_ngram(tokens, 1, min_n=2, max_n=3) == [7]
        assert propose_ngram(tokens, 1, min_n=2, max_n=2) == [8]

    def test_limits_cap_k(self):
        seqs = [make_seq([1, 2, 3, 4, 1, 2], "a"), make_seq([1, 2, 3, 4, 1, 2], "b")]
        assert NgramProposer(3).propose(seqs, [5, 1]) == [[3, 4, 1], [3]]

    def test_sizes_are_checked(self):
        with pytest.raises(ValueError, match="min_n <= max_n"):
            NgramProposer(2, min_n=3, max_n=2)


K4 = SpeculationShape(num_speculative_tokens=4)


def decoding(prompt_len: int = 5, drafts=(60, 61, 62), shape: SpeculationShape = K4, **params):
    """A scheduler with one sequence whose prefill ran and sampled token 50, and `drafts` handed over for it
    (as the speculative runner hands them after a step)."""
    scheduler = make_scheduler(max_model_len=32, speculation=shape)
    seq = make_seq(range(10, 10 + prompt_len), **params)
    scheduler.add(seq)
    scheduler.update(scheduler.schedule(), [50])
    scheduler.update_draft_token_ids({seq.request_id: list(drafts)} if drafts else {})
    return scheduler, seq


class TestVerifyBatch:
    @pytest.mark.parametrize("plain", [True, False])
    def test_a_step_without_drafts_is_a_plain_decode_step_unless_every_decode_verifies(self, plain):
        shape = SpeculationShape(4, verify_every_decode=not plain)
        scheduler, seq = decoding(prompt_len=6, drafts=(), shape=shape)
        batch = scheduler.schedule()
        assert batch.num_new_tokens == (1,) and not batch.is_prefill
        assert batch.is_verify != plain and (plain or batch.draft_token_ids == ((),))
        assert NgramProposer(3).decodes_without_drafts and NgramProposer(3).lookahead_slots == 0

    def test_drafts_get_slots_but_only_the_newest_token_counts_as_computed(self):
        scheduler, seq = decoding(prompt_len=6)                        # 7 tokens, 2 blocks of 4
        batch = scheduler.schedule()
        assert batch.is_verify and batch.draft_token_ids == ((60, 61, 62),) and not batch.is_prefill
        assert batch.num_new_tokens == (4,) and batch.num_computed_tokens == (6,) and batch.sampling == (True,)
        assert len(seq.block_table) == 3                              # slots for positions 6..9
        assert (seq.num_computed_tokens, seq.num_pending_tokens) == (7, 1)
        assert seq.draft_token_ids == []                              # taken by the step

    def test_lookahead_slots_are_reserved_past_the_drafts_and_past_a_finished_prompt(self):
        shape = SpeculationShape(4, lookahead_slots=3, verify_every_decode=True)
        scheduler = make_scheduler(max_model_len=32, speculation=shape)
        seq = make_seq(range(10, 16))                                  # 6 prompt tokens: 2 blocks, 3 with 3 more
        scheduler.add(seq)
        prefill = scheduler.schedule()
        assert prefill.is_prefill and len(seq.block_table) == 3       # slots up to position 8
        scheduler.update(prefill, [50])
        scheduler.update_draft_token_ids({"r": [60, 61]})
        batch = scheduler.schedule()                                   # positions 6..8, and 3 past them
        assert batch.draft_token_ids == ((60, 61),) and len(seq.block_table) == 3

    def test_the_accepted_run_is_appended_and_the_kv_of_the_rest_is_not_counted(self):
        scheduler, seq = decoding(prompt_len=6)
        batch = scheduler.schedule()
        assert scheduler.update_verified(batch, [[60, 61, 70]]) == [(seq, 3)]   # 2 accepted, then the target's 70
        assert seq.output_token_ids == [50, 60, 61, 70]
        assert (seq.num_computed_tokens, seq.num_uncomputed_tokens, seq.num_pending_tokens) == (9, 1, 0)
        assert len(seq.block_table) == 3                              # draft 62's slot is 70's next

    def test_a_stop_token_in_the_middle_of_a_run_cuts_it(self):
        scheduler, seq = decoding()
        batch = scheduler.schedule()
        assert scheduler.update_verified(batch, [[60, EOS, 62, 70]]) == [(seq, 2)]
        assert seq.output_token_ids == [50, 60, EOS] and seq.finish_reason == "stop"
        assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_blocks

    def test_drafts_never_reach_past_max_tokens_or_max_model_len(self):
        scheduler, seq = decoding(prompt_len=5, drafts=(60, 61, 62, 63), max_tokens=3)
        assert draft_limit(seq, 4, 32) == 1                            # 1 output so far, 1 draft + 1 more
        batch = scheduler.schedule()
        assert batch.draft_token_ids == ((60,),)
        scheduler.update_verified(batch, [[60, 70]])
        assert seq.output_token_ids == [50, 60, 70] and seq.finish_reason == "length"
        scheduler, seq = decoding(prompt_len=28, drafts=(60, 61, 62, 63), max_tokens=None)
        assert draft_limit(seq, 4, 32) == 2                            # 29 tokens, 32 at most: 2 drafts + 1
        assert scheduler.schedule().draft_token_ids == ((60, 61),)

    def test_drafts_of_a_sequence_that_finished_or_was_preempted_are_dropped(self):
        scheduler = make_scheduler(num_blocks=6, max_model_len=32, speculation=K4)
        old, young = make_seq(range(10, 17), "old"), make_seq(range(20, 27), "young")
        for seq in (old, young):
            scheduler.add(seq)
        scheduler.update(scheduler.schedule(), [50, 51])              # 8 tokens each: 2 blocks each
        scheduler.update_draft_token_ids({"old": [60, 61, 62], "young": [60, 61, 62], "gone": [1]})
        batch = scheduler.schedule()                                 # a 3rd block each: the last 2 free
        assert batch.seqs == (old, young) and scheduler.num_preemptions == 0
        scheduler.update_verified(batch, [[60, 61, 62, 70], [60, 61, 62, 71]])   # 12 tokens each, 3 blocks each
        scheduler.update_draft_token_ids({"old": [80], "young": [81]})
        batch = scheduler.schedule()                                 # each needs a 4th: the young one goes
        assert batch.seqs == (old,) and scheduler.num_preemptions == 1 and young.block_table == []
        assert young.draft_token_ids == [] and batch.draft_token_ids == ((80,),)
        scheduler.update_verified(batch, [[80, 70]])
        assert old.num_tokens == 14 and len(old.block_table) == 4
        scheduler.abort("old")
        scheduler.update_draft_token_ids({"old": [1, 2]})
        assert old.draft_token_ids == []
