"""Multi-head latent attention (DeepSeek-V2/V3) over a paged latent cache, as the custom op
`atom::mla_attention`.

The cache holds one vector per token per layer: the normalized compressed kv `c_kv` (kv_lora_rank)
then the roped, head-shared `k_pe` (qk_rope_head_dim):

    kv_cache: [num_layers, 1, num_blocks, block_size, 1, kv_lora_rank + rope_dim]

Per head h the keys and values are up-projections of c_kv, with the halves of kv_b_proj that the
build splits and stores (atom_aot/models/mla.py):

    k_nope[t, h] = W_UK[h] @ c_kv[t]     W_UK: [H, nope, r]
    v[t, h]      = W_UV[h]^T c_kv[t]     W_UV: [H, r, v]

Two equal ways to attend (equal up to float rounding; tests/test_mla.py checks it):
  naive (prefill): up-project the context's latents to per-head k/v, then standard attention;
  absorbed (decode): fold W_UK into the query (q_lat = q_nope @ W_UK: [H, r]), attend over the
    latents themselves, then apply W_UV to the latent output; reads only the cache, never k/v.
The reference runs the absorbed form for sequences computing one token and the naive one else.

An FP8 (e4m3) cache comes with the layer's `kv_scale` [2] float32: c_kv is stored as clamp(c_kv /
kv_scale[0]) and k_pe as clamp(k_pe / kv_scale[1]) (two scales: the normalized latent and the roped
rope part have different ranges), and read back multiplied by them (as ops/attention.py's per-head
cache does with its k and v scales).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_aot.ops.attention import LIBRARY, from_cache, to_cache

LIBRARY.define(
    "mla_attention(Tensor q_nope, Tensor q_pe, Tensor c_kv, Tensor k_pe, Tensor(a!) kv_cache, int layer, "
    "Tensor slot_mapping, Tensor block_tables, Tensor seq_lens, Tensor query_start_loc, Tensor w_uk, "
    "Tensor w_uv, float scale, Tensor? kv_scale=None) -> Tensor")


def mla_attention_reference(
    q_nope: torch.Tensor,         # [T, H, nope]
    q_pe: torch.Tensor,           # [T, H, rope] (roped)
    c_kv: torch.Tensor,           # [T, r] (normalized)
    k_pe: torch.Tensor,           # [T, rope] (roped)
    kv_cache: torch.Tensor,       # [L, 1, num_blocks, block_size, 1, r + rope]
    layer: int,
    slot_mapping: torch.Tensor,   # [T] int64, -1: padding
    block_tables: torch.Tensor,   # [B, max_blocks] int32
    seq_lens: torch.Tensor,       # [B] int32: tokens in context once this step's are written
    query_start_loc: torch.Tensor,  # [B + 1] int32
    w_uk: torch.Tensor,           # [H, nope, r]
    w_uv: torch.Tensor,           # [H, r, v]
    scale: float,
    kv_scale: torch.Tensor | None = None,   # [2] float32 (c_kv, k_pe) for an fp8 cache
) -> torch.Tensor:                # [T, H, v]
    write_latent_cache(kv_cache[layer], c_kv, k_pe, slot_mapping, kv_scale)
    out = q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], w_uv.shape[2])
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    singles = [b for b in range(len(lens)) if starts[b + 1] - starts[b] == 1]
    if singles:             # decoding sequences of a mixed step, together (one loop turn each cost ~6 launches)
        rows = torch.tensor([starts[b] for b in singles], device=q_nope.device)
        out[rows] = decode_rows_absorbed(q_nope[rows], q_pe[rows], kv_cache[layer],
                                         block_tables[torch.tensor(singles, device=block_tables.device)],
                                         [lens[b] for b in singles], w_uk, w_uv, scale, kv_scale)
    for b, context_len in enumerate(lens):
        first, last = starts[b], starts[b + 1]
        if last - first < 2:
            continue
        latent = read_latent(gather_latent(kv_cache[layer], block_tables[b], context_len), q_nope.dtype,
                             w_uk.shape[2], kv_scale)
        out[first:last] = mla_prefill_naive(q_nope[first:last], q_pe[first:last], latent, w_uk, w_uv, scale)
    return out


for _key in ("CPU", "CUDA"):     # the CUDA entry serves GPU arches until a fast MLA backend is chosen
    LIBRARY.impl("mla_attention", mla_attention_reference, _key)


@torch.library.register_fake("atom::mla_attention", lib=LIBRARY)
def _(q_nope, q_pe, c_kv, k_pe, kv_cache, layer, slot_mapping, block_tables, seq_lens, query_start_loc, w_uk,
      w_uv, scale, kv_scale=None):
    return q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], w_uv.shape[2])


mla_attention = torch.ops.atom.mla_attention


def write_latent_cache(kv_layer: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor,
                       slot_mapping: torch.Tensor, kv_scale: torch.Tensor | None = None) -> None:
    """Scatter each new token's [c_kv | k_pe] into its slot; padded tokens (slot -1) are dropped."""
    _, num_blocks, block_size, _, width = kv_layer.shape
    flat = kv_layer.view(num_blocks * block_size, width)
    valid = slot_mapping >= 0
    c_scale, pe_scale = (None, None) if kv_scale is None else (kv_scale[0], kv_scale[1])
    rows = torch.cat([to_cache(c_kv[valid], kv_layer.dtype, c_scale),
                      to_cache(k_pe[valid], kv_layer.dtype, pe_scale)], dim=-1)          # [T', r + rope]
    if kv_layer.element_size() == 1:   # index_copy_ has no float8 kernel: move the bytes instead
        flat, rows = flat.view(torch.uint8), rows.view(torch.uint8)
    flat.index_copy_(0, slot_mapping[valid], rows)


def gather_latent(kv_layer: torch.Tensor, block_table: torch.Tensor, context_len: int) -> torch.Tensor:
    """The first `context_len` cached latents of one sequence: [context_len, r + rope]."""
    block_size = kv_layer.shape[2]
    blocks = block_table[:-(-context_len // block_size)].long()
    return kv_layer[0, blocks].flatten(0, 1)[:context_len, 0]


def read_latent(latent: torch.Tensor, dtype: torch.dtype, rank: int,
                kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Cached latents [..., r + rope] in `dtype`: an fp8 cache's c_kv and k_pe times their scales."""
    if kv_scale is None:
        return latent.to(dtype)
    return torch.cat([from_cache(latent[..., :rank], dtype, kv_scale[0]),
                      from_cache(latent[..., rank:], dtype, kv_scale[1])], dim=-1)


DECODE_ROWS_SCORES = 1 << 27     # float32 scores [rows, H, longest context] held at once (512 MiB)


def decode_rows_absorbed(q_nope, q_pe, kv_layer, block_tables, context_lens: list[int], w_uk, w_uv, scale,
                         kv_scale=None) -> torch.Tensor:
    """mla_decode_absorbed for D sequences that compute one token each, batched: q_nope [D, H, nope], q_pe
    [D, H, rope], their block tables [D, max_blocks] and context lengths; returns [D, H, v]. Each sequence's
    latents are gathered up to the longest context and the keys past its own are masked out, their latents
    zeroed too: such a slot may never have been written (the CPU pool starts uninitialized) or hold another
    sequence's tokens, and a NaN or inf there would turn the masked key's zero weight into NaN (0 x NaN)."""
    rank, block_size = w_uk.shape[2], kv_layer.shape[2]
    longest = max(context_lens)
    lens = torch.tensor(context_lens, device=q_nope.device)
    step = max(1, DECODE_ROWS_SCORES // (q_nope.shape[1] * longest))
    parts = []
    for lo in range(0, len(context_lens), step):
        tables = block_tables[lo:lo + step, :-(-longest // block_size)].long().clamp(0, kv_layer.shape[1] - 1)
        latent = read_latent(kv_layer[0, tables].flatten(1, 2)[:, :longest, 0], q_nope.dtype, rank, kv_scale)
        seen = torch.arange(longest, device=lens.device)[None, :] < lens[lo:lo + step, None]     # [d, L]
        latent = latent.masked_fill(~seen[..., None], 0)                                         # [d, L, r + rope]
        parts.append(absorbed_attention(q_nope[lo:lo + step, None], q_pe[lo:lo + step, None], latent,
                                        seen[:, None, :], w_uk, w_uv, scale)[:, 0])
    return torch.cat(parts)


def absorbed_attention(q_nope, q_pe, latent, seen, w_uk, w_uv, scale) -> torch.Tensor:
    """The absorbed form over D sequences: queries q_nope [D, n, H, nope] and q_pe [D, n, H, rope] over their
    latents [D, L, r + rope], query i of sequence d seeing key l where seen [D, n, L]; returns [D, n, H, v]."""
    rank = w_uk.shape[2]
    q_lat = torch.einsum("dqhn,hnr->dqhr", q_nope, w_uk)                    # [D, n, H, r]
    queries = torch.cat([q_lat, q_pe], dim=-1)                              # [D, n, H, r + rope]
    scores = torch.einsum("dqhw,dlw->dhql", queries, latent)                # [D, H, n, L]
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale   # softmax in >= float32
    probs = scores.masked_fill(~seen[:, None], float("-inf")).softmax(dim=-1).to(latent.dtype)
    o_lat = torch.einsum("dhql,dlr->dqhr", probs, latent[..., :rank])       # [D, n, H, r]
    return torch.einsum("dqhr,hrv->dqhv", o_lat, w_uv)


def causal_mask(n_q: int, context_len: int, device) -> torch.Tensor:
    """[n_q, L] bool: the sequence's new tokens are its last n_q, so query i sees keys 0 .. L - n_q + i."""
    query_pos = torch.arange(n_q, device=device)[:, None] + (context_len - n_q)
    return torch.arange(context_len, device=device)[None, :] <= query_pos


def mla_prefill_naive(q_nope, q_pe, latent, w_uk, w_uv, scale) -> torch.Tensor:
    """Per-head keys/values up-projected from `latent` [L, r + rope], then causal attention: [n_q, H, v]."""
    rank = w_uk.shape[2]
    c_kv, k_pe = latent[:, :rank], latent[:, rank:]                        # [L, r], [L, rope]
    k_nope = torch.einsum("lr,hnr->hln", c_kv, w_uk)                       # [H, L, nope]
    values = torch.einsum("lr,hrv->hlv", c_kv, w_uv)                       # [H, L, v]
    keys = torch.cat([k_nope, k_pe.unsqueeze(0).expand(k_nope.shape[0], -1, -1)], dim=-1)
    queries = torch.cat([q_nope, q_pe], dim=-1).transpose(0, 1)            # [H, n_q, nope + rope]
    # 4-d [1, H, n, d]: SDPA's fused GPU kernels take no 3-d tensors (those run the math path, 14-31x slower
    # at DeepSeek-V3's 128 heads x 1024 tokens on an H200), and `is_causal` when no prefix is cached
    n_q, context_len = q_nope.shape[0], latent.shape[0]
    mask = None if n_q == context_len else causal_mask(n_q, context_len, q_nope.device)
    o = F.scaled_dot_product_attention(queries[None], keys[None], values[None], attn_mask=mask,
                                       is_causal=mask is None, scale=scale)[0]
    return o.transpose(0, 1)


def mla_decode_absorbed(q_nope, q_pe, latent, w_uk, w_uv, scale) -> torch.Tensor:
    """The same attention with W_UK folded into the query and W_UV applied after: reads only the
    latents [L, r + rope]; returns [n_q, H, v]."""
    mask = causal_mask(q_nope.shape[0], latent.shape[0], q_nope.device)
    return absorbed_attention(q_nope[None], q_pe[None], latent[None], mask[None], w_uk, w_uv, scale)[0]
