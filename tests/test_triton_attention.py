"""atom_triton::paged_attention against the torch reference (atom_aot/ops/attention.py), in float64.

Without a GPU the kernels run under TRITON_INTERPRET=1 on CPU tensors (slow: shapes stay small).
Every case draws fresh random inputs and a random block layout; outputs are checked everywhere
(padding rows must come back as zeros, never NaN). Most cases pin the key-split count with
`fixed_splits`; TestAdaptiveSplits runs one decode config at batches that split differently.
"""
import pytest
import torch

from triton_kernel_checks import rel_error
from triton_support import DEVICE, ON_GPU, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.ops.attention import reference_attention
from atom_aot.ops.triton.batch_inputs import make_paged_batch
from atom_aot.ops.triton.paged_attention import (
    CANDIDATE_CONFIGS, DEFAULT_CONFIGS, AttentionConfig, launch_paged_attention, paged_attention, reads_page_ids_ahead,
    split_count)


TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def fixed_splits(num_splits: int, block_m: int = 16, block_n: int = 16) -> AttentionConfig:
    """A config that splits keys num_splits ways at every batch of these tests (its target is never met)."""
    return AttentionConfig(block_m, block_n, 4, 2, target_programs=1 << 20, max_splits=num_splits)


def run_case(context_lens, query_lens, num_heads, num_kv_heads, head_dim, config: AttentionConfig,
             dtype=torch.float32, cache_dtype=None, pad_tokens=0, seed=0, layer=1):
    """Runs the op on a fresh random batch; returns (relative error of real rows, padding rows)."""
    g = torch.Generator().manual_seed(seed)
    batch = make_paged_batch(context_lens, query_lens, num_kv_heads, head_dim, block_size=16, pad_tokens=pad_tokens,
                             dtype=cache_dtype or dtype, device=DEVICE, generator=g)
    num_tokens = batch.slot_mapping.shape[0]
    q = torch.randn(num_tokens, num_heads, head_dim, generator=g).to(dtype).to(DEVICE)   # q: [T, H, D]
    scale = head_dim ** -0.5
    out = paged_attention(q, batch.kv_cache, layer, batch.block_tables, batch.seq_lens, batch.query_start_loc,
                          scale, *config.as_args())
    n = batch.num_real_tokens
    ref = reference_attention(q.double().cpu(), batch.kv_cache[layer].double().cpu(), batch.block_tables.cpu(),
                              batch.seq_lens.cpu(), batch.query_start_loc.cpu(), scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert not torch.isnan(out).any()
    return rel_error(out[:n].cpu(), ref[:n]), out[n:].cpu()


DECODE_CTX = [0, 15, 16, 17, 40, 200]   # seq lens 1, 16, 17, 18, 41, 201: lengths 1, = / != block multiples


class TestDecode:
    @pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 2), (8, 2)])
    @pytest.mark.parametrize("num_splits", [1, 4])
    def test_gqa_ratios_and_splits(self, num_heads, num_kv_heads, num_splits):
        err, _ = run_case(DECODE_CTX, [1] * 6, num_heads, num_kv_heads, 64,
                          fixed_splits(num_splits), seed=num_heads + num_splits)
        assert err < TOL[torch.float32]

    def test_long_context_many_splits_head_dim_128(self):
        # 1500 keys / 64 per block: 24 key blocks over 8 splits (3 each); one sequence leaves splits empty
        err, _ = run_case([1499, 30, 7], [1, 1, 1], 8, 2, 128, fixed_splits(8, block_n=64), seed=3)
        assert err < TOL[torch.float32]

    def test_padding_rows_are_zero(self):
        for splits in (1, 3):
            err, pad = run_case([5, 33], [1, 1], 4, 2, 64, fixed_splits(splits), pad_tokens=3)
            assert err < TOL[torch.float32]
            assert pad.shape[0] == 3 and torch.equal(pad, torch.zeros_like(pad))


ADAPTIVE = AttentionConfig(16, 16, 4, 2, target_programs=48, max_splits=16)   # over 2 kv heads: ceil(24 / B)


def random_contexts(batch: int, longest: int, seed: int) -> list[int]:
    """Cached lengths drawn from [0, longest): most are not multiples of the 16-token block."""
    return torch.randint(0, longest, (batch,), generator=torch.Generator().manual_seed(seed)).tolist()


class TestAdaptiveSplits:
    """One decode config at batches whose key-split counts differ (16, 8, 2, then 1)."""

    def test_split_count_follows_the_batch(self):
        assert [split_count(b, 2, 48, 16) for b in (1, 2, 3, 12, 23, 24, 64, 300)] == [16, 12, 8, 2, 2, 1, 1, 1]
        assert split_count(1, 8, 1, 1) == 1      # a config that never splits (prefill)
        assert split_count(0, 8, 512, 32) == 32  # no sequences at all: still a valid grid

    @pytest.mark.parametrize("num_heads", [2, 4, 8, 16])   # GQA groups 1, 2, 4, 8 over 2 kv heads
    @pytest.mark.parametrize("batch", [1, 3, 12])
    def test_small_batches_split_keys(self, batch, num_heads):
        assert split_count(batch, 2, 48, 16) > 1
        err, pad = run_case(random_contexts(batch, 200, seed=batch), [1] * batch, num_heads, 2, 64, ADAPTIVE,
                            pad_tokens=1, seed=batch * num_heads)
        assert err < TOL[torch.float32]
        assert torch.equal(pad, torch.zeros_like(pad))

    @pytest.mark.parametrize("batch,num_heads,longest", [(64, 4, 100), (64, 16, 60), (300, 8, 40)])
    def test_large_batches_do_not_split(self, batch, num_heads, longest):
        assert split_count(batch, 2, 48, 16) == 1
        err, pad = run_case(random_contexts(batch, longest, seed=batch + num_heads), [1] * batch, num_heads, 2, 64,
                            ADAPTIVE, pad_tokens=2, seed=batch + num_heads)
        assert err < TOL[torch.float32]
        assert torch.equal(pad, torch.zeros_like(pad))

    @pytest.mark.parametrize("batch", [1, 3, 64])
    def test_fp8_cache(self, batch):
        err, _ = run_case(random_contexts(batch, 150, seed=40 + batch), [1] * batch, 8, 2, 64, ADAPTIVE,
                          dtype=torch.bfloat16, cache_dtype=torch.float8_e4m3fn, seed=40 + batch)
        assert err < TOL[torch.bfloat16]


class TestPrefill:
    @pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 2), (8, 2)])
    def test_several_sequences(self, num_heads, num_kv_heads):
        err, _ = run_case([0, 0, 0, 0], [17, 5, 33, 1], num_heads, num_kv_heads, 64,
                          fixed_splits(1, block_m=32), seed=num_heads)
        assert err < TOL[torch.float32]

    def test_head_dim_128(self):
        err, _ = run_case([0, 0], [40, 9], 4, 2, 128, fixed_splits(1, block_m=32, block_n=32), seed=5)
        assert err < TOL[torch.float32]

    def test_head_dim_not_power_of_two(self):
        err, _ = run_case([0, 20], [12, 4], 4, 2, 80, fixed_splits(2), seed=6)
        assert err < TOL[torch.float32]


class TestChunkedAndMixed:
    @pytest.mark.parametrize("num_splits", [1, 2])
    def test_chunks_after_cached_context_with_decodes(self, num_splits):
        # chunks of prompts after 16, 37 and 5 cached tokens, two decodes, padding rows
        err, pad = run_case([16, 37, 50, 5, 0], [8, 20, 1, 3, 1], 8, 2, 64,
                            fixed_splits(num_splits, block_m=32), pad_tokens=2, seed=7 + num_splits)
        assert err < TOL[torch.float32]
        assert torch.equal(pad, torch.zeros_like(pad))

    @pytest.mark.parametrize("num_splits", [1, 3])
    def test_tiles_past_full_key_blocks(self, num_splits):
        # chunks after cached contexts: a tile's key blocks wholly before its first query run unmasked, the
        # diagonal and the last partial block masked. Tiles start every 8 queries (BLOCK_Q 8 with GROUP 2) and
        # the contexts cover every residue mod 8, so the first query falls at every offset of a 16-key block
        err, pad = run_case([0, 9, 18, 27, 36, 45, 54, 63], [40, 17, 19, 18, 21, 16, 20, 1], 4, 2, 32,
                            fixed_splits(num_splits, block_m=16, block_n=16), pad_tokens=3, seed=11 + num_splits)
        assert err < TOL[torch.float32]
        assert torch.equal(pad, torch.zeros_like(pad))

    def test_group_of_three_and_empty_sequences(self):
        # 6 q heads over 2 kv heads (GROUP 3, padded to 4); sequences 1 and 3 have no new tokens
        for splits in (1, 2):
            err, pad = run_case([5, 9, 30, 40], [2, 0, 7, 0], 6, 2, 64, fixed_splits(splits),
                                pad_tokens=2, seed=30 + splits)
            assert err < TOL[torch.float32]
            assert torch.equal(pad, torch.zeros_like(pad))

    def test_every_candidate_config(self):
        for phase, configs in CANDIDATE_CONFIGS.items():
            for i, config in enumerate(configs):
                err, _ = run_case([0, 30, 70], [9, 1, 1], 4, 2, 64, config, seed=20 + i)
                assert err < TOL[torch.float32], (phase, config)


class TestDtypes:
    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_half_precision(self, dtype):
        for splits in (1, 4):
            err, _ = run_case([0, 40, 100], [20, 1, 3], 8, 2, 64, fixed_splits(splits, block_m=32),
                              dtype=dtype, pad_tokens=1, seed=11 + splits)
            assert err < TOL[dtype]

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_fp8_cache_upcast_on_load(self, dtype):
        # the reference reads the same fp8 values (widened), so only the attention math differs
        err, _ = run_case([0, 40, 100], [12, 1, 1], 4, 2, 64, fixed_splits(2),
                          dtype=dtype, cache_dtype=torch.float8_e4m3fn, seed=13)
        assert err < TOL[dtype]


def test_launcher_and_op_agree():
    g = torch.Generator().manual_seed(17)
    batch = make_paged_batch([3, 20], [5, 1], 2, 64, dtype=torch.float32, device=DEVICE, generator=g)
    q = torch.randn(6, 4, 64, generator=g).to(DEVICE)
    args = (q, batch.kv_cache, 0, batch.block_tables, batch.seq_lens, batch.query_start_loc, 0.125,
            *fixed_splits(2).as_args())
    assert torch.equal(launch_paged_attention(*args), paged_attention(*args))


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [40, 1, 23]], ids=["decode", "mixed"])
def test_page_ids_read_ahead_change_nothing(query_lens):
    """Configs of 3+ stages read the next key block's page ids one iteration ahead (PREFETCH_PAGES); forced off, the
    same config reads them in place. Both read the same keys in the same order: equal outputs, over contexts of
    several full blocks (the unmasked loop it changes), the last one's ids read past nothing (kb + 1 == kb_hi is
    masked)."""
    assert reads_page_ids_ahead(3) and not reads_page_ids_ahead(2)
    g = torch.Generator().manual_seed(23)
    batch = make_paged_batch([130, 64, 97], query_lens, 2, 64, dtype=torch.float32, device=DEVICE, generator=g)
    q = torch.randn(sum(query_lens), 4, 64, generator=g).to(DEVICE)
    args = (q, batch.kv_cache, 1, batch.block_tables, batch.seq_lens, batch.query_start_loc, 0.125,
            *AttentionConfig(16, 16, 4, 3, 1, 1).as_args())
    ahead, inline = launch_paged_attention(*args), launch_paged_attention(*args, prefetch_pages=False)
    assert torch.equal(ahead, inline)
    ref = reference_attention(q.double().cpu(), batch.kv_cache[1].double().cpu(), batch.block_tables.cpu(),
                              batch.seq_lens.cpu(), batch.query_start_loc.cpu(), 0.125)
    assert rel_error(ahead.cpu(), ref) < TOL[torch.float32]


def test_strided_q_view():
    """q may be a head-dim-dense view (e.g. of the fused qkv output): only its strides change."""
    g = torch.Generator().manual_seed(19)
    batch = make_paged_batch([10, 0], [3, 4], 2, 64, dtype=torch.float32, device=DEVICE, generator=g)
    qkv = torch.randn(7, 8 * 64, generator=g).to(DEVICE)
    q = qkv[:, :4 * 64].unflatten(-1, (4, 64))                       # [T, H, D], row stride 512
    args = (batch.kv_cache, 1, batch.block_tables, batch.seq_lens, batch.query_start_loc, 0.125,
            *fixed_splits(1).as_args())
    assert torch.allclose(paged_attention(q, *args), paged_attention(q.contiguous(), *args), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
class TestGPU:
    @pytest.mark.parametrize("num_heads,num_kv_heads", [(16, 8), (32, 8)])
    def test_bf16_model_shapes(self, num_heads, num_kv_heads):
        decode = run_case([511, 2047, 4095, 100] * 4, [1] * 16, num_heads, num_kv_heads, 128,
                          DEFAULT_CONFIGS["decode"], dtype=torch.bfloat16, pad_tokens=4)
        prefill = run_case([0, 0, 300], [1024, 77, 513], num_heads, num_kv_heads, 128,
                           DEFAULT_CONFIGS["prefill"], dtype=torch.bfloat16)
        assert decode[0] < 2e-2 and prefill[0] < 2e-2

    def test_cuda_graph_replay_with_new_values(self):
        """The launch depends on shapes only: a graph captured once serves new lengths and tables."""
        g = torch.Generator().manual_seed(23)
        shapes = dict(num_kv_heads=8, head_dim=128, dtype=torch.bfloat16, device="cuda", generator=g)
        first = make_paged_batch([100, 700, 31, 2000], [1, 1, 1, 1], **shapes)
        second = make_paged_batch([1999, 5, 64, 1000], [1, 1, 1, 1], **shapes)
        width = max(first.block_tables.shape[1], second.block_tables.shape[1])
        cache = torch.zeros((2, 2, 200, 16, 8, 128), dtype=torch.bfloat16, device="cuda")
        tables = torch.zeros((4, width), dtype=torch.int32, device="cuda")
        lens = torch.zeros(4, dtype=torch.int32, device="cuda")
        starts = first.query_start_loc.clone()
        q = torch.randn(4, 16, 128, device="cuda", dtype=torch.bfloat16)
        args = (q, cache, 1, tables, lens, starts, 128 ** -0.5, *fixed_splits(8, block_n=64).as_args())

        def load(batch):
            nb = batch.kv_cache.shape[2]
            cache[:, :, :nb].copy_(batch.kv_cache)
            tables.zero_()
            tables[:, :batch.block_tables.shape[1]].copy_(batch.block_tables)
            lens.copy_(batch.seq_lens)

        load(first)
        paged_attention(*args)   # warm-up (compiles outside the capture)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = paged_attention(*args)
        for batch in (first, second):
            load(batch)
            graph.replay()
            ref = reference_attention(q.double().cpu(), cache[1].double().cpu(), tables.cpu(), lens.cpu(),
                                      starts.cpu(), 128 ** -0.5)
            assert rel_error(out.cpu(), ref) < 2e-2
