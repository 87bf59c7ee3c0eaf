"""BlockManager: chained prefix hashes, reference counts, reuse order, and no leaked blocks."""
import pytest

from atom_aot.runtime.scheduling.block_manager import NO_HASH, BlockManager, chain_hash
from atom_aot.runtime.scheduling.sequence import Sequence
from engine_factories import BLOCK_SIZE as BLOCK, make_seq


def run_prefill(bm: BlockManager, seq: Sequence):
    """What the scheduler and runner do for a whole prompt: find the prefix, allocate, compute."""
    bm.allocate_prefix(seq, bm.find_cached_prefix(seq))
    bm.allocate(seq, seq.num_uncomputed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_full_blocks(seq)


@pytest.fixture
def bm():
    manager = BlockManager(num_blocks=16, block_size=BLOCK)
    yield manager
    # every test frees what it takes: the pool is whole again
    assert manager.num_free_blocks == manager.num_blocks
    assert all(b.ref_count == 0 for b in manager.blocks.values())


class TestChainHash:
    def test_parent_changes_hash(self):
        assert chain_hash([1, 2, 3, 4], NO_HASH) != chain_hash([1, 2, 3, 4], chain_hash([9, 9, 9, 9], NO_HASH))

    def test_deterministic_and_content_sensitive(self):
        assert chain_hash([1, 2, 3, 4], 7) == chain_hash([1, 2, 3, 4], 7)
        assert chain_hash([1, 2, 3, 4], 7) != chain_hash([1, 2, 3, 5], 7)


class TestAllocate:
    def test_blocks_cover_tokens(self, bm):
        seq = make_seq(range(10))
        run_prefill(bm, seq)
        assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
        assert bm.num_free_blocks == 13
        assert len(seq.block_hashes) == 2           # two full blocks, the third is partial
        bm.free(seq)

    def test_append_grows_only_at_block_boundary(self, bm):
        seq = make_seq(range(8))
        run_prefill(bm, seq)
        assert bm.blocks_needed(seq, 1) == 1        # token 9 starts a new block
        seq.token_ids.append(99)
        bm.allocate(seq, 1)
        seq.num_computed_tokens += 1
        assert len(seq.block_table) == 3 and bm.blocks_needed(seq, 1) == 0
        bm.free(seq)

    def test_lookup_takes_nothing(self, bm):
        a = make_seq(range(9), "a")
        run_prefill(bm, a)
        bm.free(a)
        free = bm.num_free_blocks
        b = make_seq(range(9), "b")
        assert len(bm.find_cached_prefix(b)) == 2 and bm.num_free_blocks == free and not b.block_table

    def test_revived_cached_blocks_count_against_the_pool(self):
        bm = BlockManager(num_blocks=3, block_size=BLOCK)
        a = make_seq(range(9), "a")
        run_prefill(bm, a)
        bm.free(a)                       # 2 cached blocks, now free, plus 1
        b = make_seq(range(9), "b")
        cached = bm.find_cached_prefix(b)
        assert bm.can_allocate_with_prefix(b, cached, 1)       # 2 revived + 1 new = 3
        assert not bm.can_allocate_with_prefix(b, cached, 5)   # would need a 4th

    def test_can_allocate_respects_pool(self):
        bm = BlockManager(num_blocks=2, block_size=BLOCK)
        seq = make_seq(range(12))
        assert not bm.can_allocate(seq, 12) and bm.can_allocate(seq, 8)


class TestPrefixCaching:
    def test_shared_prefix_is_reused_with_ref_counts(self, bm):
        a, b = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a"), make_seq([1, 2, 3, 4, 5, 6, 7, 8, 42, 43], "b")
        run_prefill(bm, a)
        bm.allocate_prefix(b, bm.find_cached_prefix(b))
        assert b.block_table == a.block_table[:2] and b.num_cached_tokens == 8
        assert [bm.blocks[i].ref_count for i in b.block_table] == [2, 2]
        assert bm.prefix_hits == 2
        bm.allocate(b, b.num_uncomputed_tokens)
        bm.free(a)
        assert [bm.blocks[i].ref_count for i in b.block_table[:2]] == [1, 1]
        bm.free(b)

    def test_freed_cached_blocks_are_found_again(self, bm):
        a = make_seq(range(12), "a")
        run_prefill(bm, a)
        table = list(a.block_table)
        bm.free(a)
        b = make_seq(range(13), "b")
        bm.allocate_prefix(b, bm.find_cached_prefix(b))
        assert b.block_table == table and b.num_computed_tokens == 12
        bm.free(b)

    def test_fully_cached_prompt_still_computes_its_last_token(self, bm):
        a = make_seq(range(8), "a")
        run_prefill(bm, a)
        b = make_seq(range(8), "b")
        bm.allocate_prefix(b, bm.find_cached_prefix(b))
        assert b.num_cached_tokens == 4 and b.num_uncomputed_tokens == 4
        bm.free(a), bm.free(b)

    def test_different_prefix_misses(self, bm):
        a = make_seq([1, 2, 3, 4, 5], "a")
        run_prefill(bm, a)
        b = make_seq([1, 2, 3, 5, 5], "b")
        bm.allocate_prefix(b, bm.find_cached_prefix(b))
        assert b.block_table == [] and bm.prefix_hits == 0 and bm.prefix_queries == 2
        bm.free(a), bm.free(b)

    def test_reuse_order_is_lru_and_evicts_hash(self):
        bm = BlockManager(num_blocks=4, block_size=BLOCK)
        a, b = make_seq(range(4), "a"), make_seq(range(100, 104), "b")
        run_prefill(bm, a)
        run_prefill(bm, b)
        bm.free(a)
        bm.free(b)          # a's block was freed first: least recently used
        c = make_seq(range(200, 212), "c")
        bm.allocate(c, 12)  # takes the two never-cached blocks, then a's cached block
        assert a.block_table == [] and bm.num_free_blocks == 1
        assert len(bm.hash_to_block) == 1          # a's hash was evicted, b's survives
        d = make_seq(list(range(100, 104)) + [7], "d")
        bm.allocate_prefix(d, bm.find_cached_prefix(d))
        assert d.num_cached_tokens == 4
        bm.free(c), bm.free(d)

    def test_disabled(self):
        bm = BlockManager(num_blocks=8, block_size=BLOCK, enable_prefix_caching=False)
        a = make_seq(range(9), "a")
        run_prefill(bm, a)
        b = make_seq(range(9), "b")
        bm.allocate_prefix(b, bm.find_cached_prefix(b))
        assert b.block_table == [] and not bm.hash_to_block
        bm.free(a)
        assert bm.num_free_blocks == 8


class TestRefCounts:
    def test_a_block_shared_by_three_is_free_only_after_the_last(self, bm):
        seqs = [make_seq([1, 2, 3, 4, 5, 6, 7, 8, 10 + i], str(i)) for i in range(3)]
        for seq in seqs:
            run_prefill(bm, seq)
        shared = seqs[0].block_table[:2]
        assert all(s.block_table[:2] == shared for s in seqs)
        assert [bm.blocks[b].ref_count for b in shared] == [3, 3]
        assert bm.num_free_blocks == 16 - 2 - 3          # two shared blocks, one tail each
        bm.free(seqs[1])
        bm.free(seqs[0])
        assert [bm.blocks[b].ref_count for b in shared] == [1, 1] and not set(shared) & set(bm.free_block_ids)
        bm.free(seqs[2])
        assert set(shared) <= set(bm.free_block_ids)

    def test_a_prefix_in_use_costs_no_free_block(self):
        bm = BlockManager(num_blocks=3, block_size=BLOCK)
        a = make_seq(range(9), "a")
        run_prefill(bm, a)                               # all three blocks taken
        b = make_seq(list(range(8)) + [50], "b")
        cached = bm.find_cached_prefix(b)
        assert len(cached) == 2 and bm.num_free_blocks == 0
        assert bm.can_allocate_with_prefix(b, cached, 0)          # shares both, needs nothing new
        assert not bm.can_allocate_with_prefix(b, cached, 1)      # its own last token needs a block


class TestReuseOrder:
    def test_unhashed_blocks_are_reused_before_cached_ones(self):
        bm = BlockManager(num_blocks=3, block_size=BLOCK)
        a = make_seq(range(6), "a")                      # one full (hashed) block, one partial
        run_prefill(bm, a)
        partial = a.block_table[1]
        bm.free(a)
        b = make_seq(range(100, 102), "b")
        bm.allocate(b, 2)
        assert b.block_table == [partial]                # it cached nothing: first, even before unused ones
        c = make_seq(range(200, 202), "c")
        bm.allocate(c, 2)
        assert c.block_table == [2]
        assert len(bm.find_cached_prefix(make_seq(range(6), "again"))) == 1   # the hashed block is kept
        bm.free(b), bm.free(c)

    def test_a_freed_sequence_gives_up_its_tail_before_its_head(self):
        bm = BlockManager(num_blocks=3, block_size=BLOCK)
        a = make_seq(range(12), "a")
        run_prefill(bm, a)
        head, middle, tail = a.block_table
        bm.free(a)
        b = make_seq(range(100, 104), "b")
        bm.allocate(b, 4)
        assert b.block_table == [tail]
        again = make_seq(list(range(12)) + [1], "again")
        assert bm.find_cached_prefix(again) == [head, middle]   # the shared head lives longest
        bm.free(b)

    def test_a_duplicate_block_does_not_steal_the_cached_one(self):
        """Two sequences computing the same prefix at once: the first block cached stays the one found."""
        bm = BlockManager(num_blocks=8, block_size=BLOCK)
        a, b = make_seq(range(5), "a"), make_seq(range(5), "b")
        for seq in (a, b):                               # both allocated before either is cached
            bm.allocate(seq, 5)
        for seq in (a, b):
            seq.num_computed_tokens = 5
            bm.cache_full_blocks(seq)
        assert a.block_table[0] != b.block_table[0] and a.block_hashes == b.block_hashes
        bm.free(b)
        filler = make_seq(range(100, 108), "filler")
        bm.allocate(filler, 8)                           # reuses b's blocks, evicting nothing of a's
        assert bm.find_cached_prefix(make_seq(range(5), "c")) == [a.block_table[0]]
        bm.free(a), bm.free(filler)


class TestCanAllocate:
    def test_nothing_new_needs_no_block(self):
        bm = BlockManager(num_blocks=1, block_size=BLOCK)
        seq = make_seq(range(4))
        run_prefill(bm, seq)
        assert bm.num_free_blocks == 0 and bm.can_allocate(seq, 0) and bm.blocks_needed(seq, 0) == 0
        bm.free(seq)

    def test_a_partial_last_block_takes_tokens_first(self):
        bm = BlockManager(num_blocks=2, block_size=BLOCK)
        seq = make_seq(range(5))
        run_prefill(bm, seq)                             # 5 tokens: the second block has 3 slots left
        assert bm.blocks_needed(seq, 3) == 0 and bm.blocks_needed(seq, 4) == 1
        assert bm.can_allocate(seq, 3) and not bm.can_allocate(seq, 4)
        bm.free(seq)

    def test_exact_fit_at_a_block_boundary(self):
        bm = BlockManager(num_blocks=2, block_size=BLOCK)
        seq = make_seq(range(9))
        assert bm.can_allocate(seq, 8) and not bm.can_allocate(seq, 9)
