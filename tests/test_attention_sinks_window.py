"""Attention sinks and sliding windows (GPT-OSS): the reference op against a naive float64 softmax written
token by token, and atom_triton::paged_attention against the reference, on fresh random paged batches.

Without a GPU the Triton kernel runs in the interpreter: shapes stay small, but every path is taken: decode
with key splits (the sink counted once over the splits), prefill tiles longer than the window, chunked
prefill whose window reaches into the cached context, windows of 1 and past the context, padding rows.
"""
import math

import pytest
import torch

from triton_kernel_checks import rel_error
from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.ops.attention import gather_context, reference_attention
from atom_aot.ops.triton.batch_inputs import make_paged_batch
from atom_aot.ops.triton.paged_attention import AttentionConfig, paged_attention

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def naive_attention(q, kv_layer, batch, scale, sinks, window):
    """Query by query, head by head, in float64: softmax over the visible keys' logits and the sink's."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    starts, lens = batch.query_start_loc.tolist(), batch.seq_lens.tolist()
    group = q.shape[1] // kv_layer.shape[-2]
    for b, context_len in enumerate(lens):
        keys, values = (t.double() for t in gather_context(kv_layer.cpu(), batch.block_tables[b].cpu(), context_len))
        for row in range(starts[b], starts[b + 1]):
            pos = context_len - (starts[b + 1] - row)
            first = 0 if window is None else max(0, pos - window + 1)
            for h in range(q.shape[1]):
                logits = [float(q[row, h].double() @ keys[j, h // group]) * scale for j in range(first, pos + 1)]
                extra = [] if sinks is None else [float(sinks[h])]
                top = max(logits + extra)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights) + sum(math.exp(x - top) for x in extra)
                out[row, h] = sum(w * values[first + j, h // group] for j, w in enumerate(weights)) / total
    return out


def random_case(context_lens, query_lens, num_heads, num_kv_heads, head_dim, *, sinks: bool, seed: int,
                dtype=torch.float32, pad_tokens=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    batch = make_paged_batch(context_lens, query_lens, num_kv_heads, head_dim, block_size=16, pad_tokens=pad_tokens,
                             dtype=dtype, device=device, generator=g)
    q = torch.randn(batch.slot_mapping.shape[0], num_heads, head_dim, generator=g).to(dtype).to(device)  # [T, H, D]
    sink_logits = (2 * torch.randn(num_heads, generator=g)).to(dtype).to(device) if sinks else None
    return batch, q, sink_logits


class TestReference:
    @pytest.mark.parametrize("sinks,window", [(True, None), (False, 5), (True, 5), (True, 1), (True, 400)])
    def test_matches_naive_softmax(self, sinks, window):
        batch, q, sink_logits = random_case([0, 9, 30], [12, 1, 4], 4, 2, 8, sinks=sinks, seed=window or 0,
                                            device="cpu")
        scale = 8 ** -0.5
        got = reference_attention(q.double(), batch.kv_cache[1].double(), batch.block_tables, batch.seq_lens,
                                  batch.query_start_loc, scale, sinks=None if sink_logits is None
                                  else sink_logits.double(), sliding_window=window)
        want = naive_attention(q, batch.kv_cache[1], batch, scale, sink_logits, window)
        assert rel_error(got, want) < 1e-12

    def test_a_sink_shrinks_every_row_and_a_window_drops_old_keys(self):
        batch, q, _ = random_case([20], [1], 2, 1, 8, sinks=False, seed=3, device="cpu")
        args = (q.double(), batch.kv_cache[0].double(), batch.block_tables, batch.seq_lens, batch.query_start_loc, 1.0)
        plain = reference_attention(*args)
        assert not torch.allclose(reference_attention(*args, sinks=torch.tensor([3.0, -1.0]).double()), plain)
        assert not torch.allclose(reference_attention(*args, sliding_window=4), plain)
        assert torch.equal(reference_attention(*args, sliding_window=21), plain)    # the whole context fits


def config(block_m=16, block_n=16, splits=1, target=1 << 20) -> AttentionConfig:
    return AttentionConfig(block_m, block_n, 4, 2, target_programs=target, max_splits=splits)


def triton_error(context_lens, query_lens, num_heads, num_kv_heads, head_dim, cfg, *, sinks, window, seed,
                 dtype=torch.float32, pad_tokens=0):
    """(relative error of the real rows against the float64 reference, the padding rows)."""
    batch, q, sink_logits = random_case(context_lens, query_lens, num_heads, num_kv_heads, head_dim, sinks=sinks,
                                        seed=seed, dtype=dtype, pad_tokens=pad_tokens)
    scale = head_dim ** -0.5
    out = paged_attention(q, batch.kv_cache, 1, batch.block_tables, batch.seq_lens, batch.query_start_loc, scale,
                          *cfg.as_args(), None, sink_logits, window)
    n = batch.num_real_tokens
    ref = reference_attention(q.double().cpu(), batch.kv_cache[1].double().cpu(), batch.block_tables.cpu(),
                              batch.seq_lens.cpu(), batch.query_start_loc.cpu(), scale,
                              sinks=None if sink_logits is None else sink_logits.double().cpu(), sliding_window=window)
    assert out.shape == q.shape and not torch.isnan(out).any()
    return rel_error(out[:n].cpu(), ref[:n]), out[n:].cpu()


class TestTritonKernel:
    @pytest.mark.parametrize("splits", [1, 4])
    @pytest.mark.parametrize("sinks,window", [(True, None), (False, 20), (True, 20), (True, 1)])
    def test_decode(self, splits, sinks, window):
        # contexts shorter than, across and far past the window; 8 query heads per kv head (GPT-OSS's group)
        err, _ = triton_error([0, 15, 19, 40, 130], [1] * 5, 16, 2, 32, config(splits=splits), sinks=sinks,
                              window=window, seed=splits + (window or 0))
        assert err < TOL[torch.float32]

    @pytest.mark.parametrize("sinks,window", [(True, 24), (False, 7), (True, 40)])
    def test_prefill_longer_than_the_window(self, sinks, window):
        # 16-row tiles of 2 heads x 8 tokens; windows inside one key block, across blocks, past the prompt
        err, _ = triton_error([0, 0], [70, 33], 4, 2, 16, config(block_m=16, block_n=16), sinks=sinks,
                              window=window, seed=window)
        assert err < TOL[torch.float32]

    @pytest.mark.parametrize("splits", [1, 3])
    def test_chunked_prefill_reaches_into_the_cache_beside_decodes(self, splits):
        err, _ = triton_error([50, 20, 90, 3], [9, 1, 17, 1], 8, 2, 16, config(splits=splits), sinks=True,
                              window=16, seed=7 + splits)
        assert err < TOL[torch.float32]

    def test_padding_rows_are_zero_with_sinks(self):
        for splits in (1, 3):
            err, pad = triton_error([5, 33], [1, 1], 4, 2, 16, config(splits=splits), sinks=True, window=8, seed=2,
                                    pad_tokens=3)
            assert err < TOL[torch.float32]
            assert pad.shape[0] == 3 and torch.equal(pad, torch.zeros_like(pad))

    def test_bf16_decode_and_prefill(self):
        err, _ = triton_error([0, 60], [20, 1], 8, 2, 64, config(block_m=32, block_n=32, splits=2), sinks=True,
                              window=16, seed=5, dtype=torch.bfloat16)
        assert err < TOL[torch.bfloat16]

    def test_bad_options_refused(self):
        batch, q, _ = random_case([4], [1], 4, 2, 16, sinks=False, seed=0)
        args = (q, batch.kv_cache, 0, batch.block_tables, batch.seq_lens, batch.query_start_loc, 0.25,
                *config().as_args(), None)
        with pytest.raises(ValueError, match="one contiguous logit per query head"):
            paged_attention(*args, torch.zeros(3, device=DEVICE), None)
        with pytest.raises(ValueError, match="sliding_window must be >= 1"):
            paged_attention(*args, None, 0)
