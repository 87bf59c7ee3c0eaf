"""The Triton attention kernels with an fp8 cache's (k, v) scales, against the reference path
(atom_aot/ops/attention.py) on fresh random inputs, under TRITON_INTERPRET=1 without a GPU."""
import pytest
import torch

from triton_kernel_checks import rel_error
from triton_support import DEVICE, ON_GPU, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.ops.attention import reference_attention, write_kv_cache
from atom_aot.ops.rope import apply_rope, rope_cos_sin_cache
from atom_aot.ops.triton import rope_cache
from atom_aot.ops.triton.batch_inputs import make_paged_batch
from atom_aot.ops.triton.paged_attention import launch_paged_attention

FP8 = torch.float8_e4m3fn
KV_SCALE = torch.tensor([0.05, 0.3], device=DEVICE)


def test_cache_write_quantizes_like_the_reference():
    g = torch.Generator().manual_seed(1)
    batch = make_paged_batch([0, 21, 5], [9, 1, 4], 2, 64, pad_tokens=2, dtype=FP8, generator=g, device=DEVICE)
    t = batch.slot_mapping.shape[0]
    q, k = torch.randn(t, 4, 64, generator=g).to(DEVICE), 8 * torch.randn(t, 2, 64, generator=g).to(DEVICE)
    v = 40 * torch.randn(t, 2, 64, generator=g).to(DEVICE)    # some values past 448 * 0.3 clamp
    cos_sin = rope_cos_sin_cache(64, 10000.0, {}, 64).to(DEVICE)
    ref_cache = batch.kv_cache.clone()
    _, k_rot = apply_rope(batch.positions, q, k, cos_sin)
    write_kv_cache(ref_cache[1], k_rot, v, batch.slot_mapping, KV_SCALE)
    cache = batch.kv_cache.clone()
    rope_cache.qk_norm_rope_cache_write(q, k, v, batch.positions, cos_sin, None, None, 0.0, cache, 1,
                                        batch.slot_mapping, 2, 4, KV_SCALE)
    slots = batch.slot_mapping[batch.slot_mapping >= 0]
    got = cache[1].view(2, -1, 2, 64)[:, slots].float()
    want = ref_cache[1].view(2, -1, 2, 64)[:, slots].float()
    assert not torch.isnan(got).any()
    # rope's float32 order may move a key across an fp8 rounding boundary: one e4m3 step at most, rarely
    close = (got - want).abs() <= want.abs() / 8 + 1e-6
    assert close.all() and (got == want).float().mean() > 0.98
    assert torch.equal(cache[0].view(torch.uint8), batch.kv_cache[0].view(torch.uint8))   # other layers untouched


@pytest.mark.parametrize("query_lens,max_splits", [([1, 1, 1], 4), ([9, 1, 4], 1)], ids=["decode-split", "mixed"])
def test_attention_dequantizes_in_registers(query_lens, max_splits):
    g = torch.Generator().manual_seed(2)
    batch = make_paged_batch([40, 15, 70], query_lens, 2, 64, dtype=FP8, generator=g, device=DEVICE)
    q = torch.randn(batch.slot_mapping.shape[0], 4, 64, generator=g).to(DEVICE)
    out = launch_paged_attention(q, batch.kv_cache, 1, batch.block_tables, batch.seq_lens, batch.query_start_loc,
                                 0.125, 16, 16, 4, 2, 1 << 20, max_splits, KV_SCALE)
    ref = reference_attention(q.double(), batch.kv_cache[1], batch.block_tables, batch.seq_lens,
                              batch.query_start_loc, 0.125, KV_SCALE.double())
    assert rel_error(out, ref) < 1e-5
