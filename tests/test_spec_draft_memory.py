"""--method draft on a GPU: the memory share left after both models' weights holds both KV pools."""
import pytest


@pytest.mark.parametrize("block_size,draft_block_size", [(16, 16), (16, 32), (32, 16)])
def test_the_gpu_kv_budget_holds_the_target_and_draft_pools(block_size, draft_block_size):
    # a draft as big as the target (same per-token bytes) leaves about half the budget to each pool; the
    # largest target pool whose draft pool (as start_draft sizes it) still fits is chosen
    from atom_aot.runtime.execution.memory import split_kv_budget
    from atom_aot.runtime.spec.setup import draft_kv_blocks
    per_token = 1024
    per_block, draft_per_block = per_token * block_size, per_token * draft_block_size
    for budget in (10**6, 10**8 + 12345, 3 * 10**9):
        n = split_kv_budget(budget, per_block, block_size, draft_per_block, draft_block_size, max_num_seqs=8)
        used = n * per_block + draft_kv_blocks(draft_block_size, n * block_size, 8) * draft_per_block
        more = (n + 1) * per_block + draft_kv_blocks(draft_block_size, (n + 1) * block_size, 8) * draft_per_block
        assert used <= budget < more
        assert n * per_block < budget / 2 < 1.1 * n * per_block + 8 * draft_per_block
    assert split_kv_budget(1000, per_block, block_size, draft_per_block, draft_block_size, 8) == 0
