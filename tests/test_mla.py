"""MLA's two forms agree (absorbed decode == naive up-projection), and YaRN's rope table and softmax
scale are HF's."""
import math

import pytest
import torch

from atom_aot.models.mla import split_kv_b_proj
from atom_aot.ops.mla import (decode_rows_absorbed, gather_latent, mla_attention, mla_decode_absorbed,
                              mla_prefill_naive, read_latent)
from atom_aot.ops.rope import rope_cos_sin_cache, yarn_softmax_scale

H, NOPE, ROPE, RANK, V = 4, 16, 8, 32, 24


def random_mla(seed: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)
    kv_b = rand(H * (NOPE + V), RANK) * 0.2
    w_uk, w_uv = split_kv_b_proj(kv_b, H, NOPE)
    return rand, kv_b, w_uk, w_uv


class TestAbsorbedEqualsNaive:
    @pytest.mark.parametrize("seed,context", [(0, 1), (1, 37), (2, 300)])
    def test_one_query_over_a_context(self, seed, context):
        rand, _, w_uk, w_uv = random_mla(seed)
        q_nope, q_pe, latent = rand(1, H, NOPE), rand(1, H, ROPE), rand(context, RANK + ROPE)
        naive = mla_prefill_naive(q_nope, q_pe, latent, w_uk, w_uv, 0.1)
        absorbed = mla_decode_absorbed(q_nope, q_pe, latent, w_uk, w_uv, 0.1)
        torch.testing.assert_close(absorbed, naive, rtol=1e-10, atol=1e-10)

    def test_several_causal_queries(self):
        rand, _, w_uk, w_uv = random_mla(3)
        q_nope, q_pe, latent = rand(5, H, NOPE), rand(5, H, ROPE), rand(20, RANK + ROPE)
        torch.testing.assert_close(mla_decode_absorbed(q_nope, q_pe, latent, w_uk, w_uv, 0.2),
                                   mla_prefill_naive(q_nope, q_pe, latent, w_uk, w_uv, 0.2), rtol=1e-10, atol=1e-10)

    def test_split_matches_kv_b_proj(self):
        """W_UK / W_UV reproduce kv_b_proj's per-head k_nope and v."""
        rand, kv_b, w_uk, w_uv = random_mla(4)
        c = rand(6, RANK)
        k_nope, v = (c @ kv_b.T).unflatten(-1, (H, NOPE + V)).split([NOPE, V], dim=-1)
        torch.testing.assert_close(torch.einsum("tr,hnr->thn", c, w_uk), k_nope)
        torch.testing.assert_close(torch.einsum("tr,hrv->thv", c, w_uv), v)


def test_op_paged_decode_and_prefill_over_blocks():
    """The op writes the latents into scattered blocks; a sequence's decode row (absorbed) equals the naive
    form over the same cached context, and a 3-token chunk equals the naive form too."""
    rand, _, w_uk, w_uv = random_mla(5, torch.float32)
    block_size, blocks = 4, torch.tensor([[5, 2, 7, 0], [1, 3, 6, 4]], dtype=torch.int32)
    cache = torch.zeros(2, 1, 8, block_size, 1, RANK + ROPE)
    history = [rand(13, RANK + ROPE), rand(9, RANK + ROPE)]      # tokens already cached: 13 and 9
    for b, latent in enumerate(history):
        for t, row in enumerate(latent):
            cache[1, 0, blocks[b, t // block_size], t % block_size, 0] = row
    new = [1, 3]
    slots = torch.tensor([blocks[b, t // block_size] * block_size + t % block_size
                          for b, n in enumerate(new) for t in range(len(history[b]), len(history[b]) + n)], dtype=torch.int64)
    q_nope, q_pe = rand(4, H, NOPE), rand(4, H, ROPE)
    c_kv, k_pe = rand(4, RANK), rand(4, ROPE)
    out = mla_attention(q_nope, q_pe, c_kv, k_pe, cache, 1, slots, blocks, torch.tensor([14, 12], dtype=torch.int32),
                        torch.tensor([0, 1, 4], dtype=torch.int32), w_uk, w_uv, 0.15)
    full = [torch.cat([history[0], torch.cat([c_kv[:1], k_pe[:1]], -1)]),
            torch.cat([history[1], torch.cat([c_kv[1:], k_pe[1:]], -1)])]
    torch.testing.assert_close(out[:1], mla_prefill_naive(q_nope[:1], q_pe[:1], full[0], w_uk, w_uv, 0.15))
    torch.testing.assert_close(out[1:], mla_prefill_naive(q_nope[1:], q_pe[1:], full[1], w_uk, w_uv, 0.15))


class TestYarn:
    SCALING = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
               "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}

    def test_table_is_hfs(self):
        """cos/sin equal transformers' DeepseekV3RotaryEmbedding (inv_freq and attention factor)."""
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
        config = DeepseekV3Config(qk_rope_head_dim=64, max_position_embeddings=163840, rope_theta=10000.0,
                                  rope_scaling=dict(self.SCALING))
        rotary = DeepseekV3RotaryEmbedding(config)
        positions = torch.arange(0, 163840, 997)[None]
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions)
        table = rope_cos_sin_cache(64, 10000.0, self.SCALING, 163840)[positions[0]]
        torch.testing.assert_close(table[:, :32], cos[0, :, :32], rtol=0, atol=0)
        torch.testing.assert_close(table[:, 32:], sin[0, :, :32], rtol=0, atol=0)
        assert rotary.attention_scaling != 1.0

    def test_softmax_scale_is_hfs(self):
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale
        assert yarn_softmax_scale(192 ** -0.5, self.SCALING) == yarn_apply_mscale(self.SCALING, 192 ** -0.5)
        assert yarn_softmax_scale(0.1, {}) == 0.1
        assert math.isclose(yarn_softmax_scale(1.0, self.SCALING), (0.1 * 0.8 * math.log(40) + 1) ** 2)


def test_an_fp8_latent_cache_stores_scaled_values_and_reads_them_back():
    """With kv_scale (c_kv, k_pe) an e4m3 cache holds clamp(x / scale); the op then attends over exactly
    what a float32 cache holding those dequantized latents gives, and close to the unquantized result."""
    rand, _, w_uk, w_uv = random_mla(6, torch.float32)
    block_size, blocks = 4, torch.tensor([[3, 1, 0]], dtype=torch.int32)
    n = 10
    slots = torch.tensor([blocks[0, t // block_size] * block_size + t % block_size for t in range(n)], dtype=torch.int64)
    q_nope, q_pe, c_kv, k_pe = rand(n, H, NOPE), rand(n, H, ROPE), rand(n, RANK), rand(n, ROPE) * 5
    kv_scale = torch.tensor([c_kv.abs().max() / 448, k_pe.abs().max() / 448])
    args = (slots, blocks, torch.tensor([n], dtype=torch.int32), torch.tensor([0, n], dtype=torch.int32), w_uk, w_uv, 0.2)
    fp8 = torch.zeros(1, 1, 4, block_size, 1, RANK + ROPE, dtype=torch.float8_e4m3fn)
    out = mla_attention(q_nope, q_pe, c_kv, k_pe, fp8, 0, *args, kv_scale)
    stored = fp8[0, 0].flatten(0, 1)[slots, 0].float()
    torch.testing.assert_close(stored[:, :RANK], (c_kv / kv_scale[0]).to(torch.float8_e4m3fn).float())
    dequantized = torch.cat([stored[:, :RANK] * kv_scale[0], stored[:, RANK:] * kv_scale[1]], dim=-1)
    f32 = torch.zeros(1, 1, 4, block_size, 1, RANK + ROPE)
    expected = mla_attention(q_nope, q_pe, dequantized[:, :RANK], dequantized[:, RANK:], f32, 0, *args)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    exact = mla_attention(q_nope, q_pe, c_kv, k_pe, torch.zeros_like(f32), 0, *args)
    assert (out - exact).norm() / exact.norm() < 0.05


def assert_each_row_alone(got, q_nope, q_pe, cache, tables, lens, w_uk, w_uv, kv_scale):
    """Row b of decode_rows_absorbed's output equals mla_decode_absorbed over exactly sequence b's latents."""
    for b, n in enumerate(lens):
        latent = read_latent(gather_latent(cache, tables[b], n), torch.float32, RANK, kv_scale)
        want = mla_decode_absorbed(q_nope[b:b + 1], q_pe[b:b + 1], latent, w_uk, w_uv, 0.15)
        torch.testing.assert_close(got[b:b + 1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("piece", [1 << 27, 2 * H * 20])         # all rows at once; two rows a piece (longest 20)
@pytest.mark.parametrize("fp8", [False, True])
def test_decode_rows_together_equal_each_alone(monkeypatch, piece, fp8):
    """A mixed step's decoding sequences go through decode_rows_absorbed together: each row equals
    mla_decode_absorbed over that sequence's own cached latents (contexts of different lengths; table slots
    past a sequence's blocks hold other sequences' blocks or garbage ids, masked or clamped), an fp8 cache
    read through its scales."""
    from atom_aot.ops import mla
    monkeypatch.setattr(mla, "DECODE_ROWS_SCORES", piece)
    rand, _, w_uk, w_uv = random_mla(6, torch.float32)
    cache = (rand(1, 12, 4, 1, RANK + ROPE) * 2).to(torch.float8_e4m3fn if fp8 else torch.float32)
    kv_scale = torch.tensor([0.5, 2.0]) if fp8 else None
    tables = torch.tensor([[3, 9, 1, 7, 99], [0, 5, 0, 0, 0], [11, 2, 8, 4, 6], [10, -1, 77, 0, 0]], dtype=torch.int32)
    lens = [13, 6, 20, 2]
    q_nope, q_pe = rand(4, H, NOPE), rand(4, H, ROPE)
    got = decode_rows_absorbed(q_nope, q_pe, cache, tables, lens, w_uk, w_uv, 0.15, kv_scale)
    assert_each_row_alone(got, q_nope, q_pe, cache, tables, lens, w_uk, w_uv, kv_scale)


@pytest.mark.parametrize("fp8", [False, True])
def test_decode_rows_ignore_what_slots_past_their_context_hold(fp8):
    """Rows of different lengths read up to the longest context; the slots past a row's own (its block's
    unwritten tail, a padded table's block 0) may hold anything, NaN and inf too (the CPU pool starts
    uninitialized): each row still equals mla_decode_absorbed over exactly its own latents."""
    rand, _, w_uk, w_uv = random_mla(7, torch.float32)
    block_size, dtype = 4, torch.float8_e4m3fn if fp8 else torch.float32
    cache = torch.full((1, 6, block_size, 1, RANK + ROPE), float("nan"))
    cache[0, 5, 2:, 0, :RANK] = float("inf")                   # e4m3 has no inf: NaN there too
    tables = torch.tensor([[4, 1, 3], [0, 5, 0], [2, 0, 0]], dtype=torch.int32)
    lens = [10, 5, 3]       # rows 1 and 2 read 10 positions: their blocks' unwritten tails, block 0 for padding
    for b, n in enumerate(lens):
        for t in range(n):
            cache[0, tables[b, t // block_size], t % block_size, 0] = rand(RANK + ROPE)
    cache = cache.to(dtype)
    kv_scale = torch.tensor([0.5, 2.0]) if fp8 else None
    q_nope, q_pe = rand(3, H, NOPE), rand(3, H, ROPE)
    got = decode_rows_absorbed(q_nope, q_pe, cache, tables, lens, w_uk, w_uv, 0.15, kv_scale)
    assert_each_row_alone(got, q_nope, q_pe, cache, tables, lens, w_uk, w_uv, kv_scale)
