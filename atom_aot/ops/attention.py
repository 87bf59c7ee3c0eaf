"""Attention over the paged KV cache, as the custom op `atom::paged_attention`.

Being a custom op keeps attention opaque to `torch.export`: the compiled model calls it by name,
so the graph splits around it and each arch registers its own kernel for it (a torch reference
here; Triton kernels register for CUDA). The op writes the new keys/values into the cache in
place, then attends over everything the sequence has cached.

KV cache layout (one tensor for the whole model):

    kv_cache: [num_layers, 2 (k, v), num_blocks, block_size, num_kv_heads, head_dim]

Token t of a sequence lives in block `block_table[t // block_size]`, row `t % block_size`;
`slot_mapping` gives each new token's flat slot `block * block_size + row` (-1: padding, skipped).

An FP8 cache comes with the layer's `kv_scale` [2] float32 (k, v; per tensor): a key is stored as
clamp(k / k_scale) in e4m3 and read back as stored * k_scale (values likewise). Without it (a cache in
the model dtype) keys and values are stored as they are.

Two per-layer options a family may pass (GPT-OSS uses both):
- `sinks` [H]: a learned logit per query head that joins every row's softmax as one more key with no
  value: it takes its share of the denominator, so the weights over the real keys sum to less than 1.
- `sliding_window` W: the query at position p sees only the keys at positions p - W + 1 .. p (the W
  most recent, itself included: transformers' sliding-window mask). None: every earlier key.
The cache keeps every key either way; only what attention reads changes (docs/gpt-oss.md).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


# Registered through the dispatcher directly (not `torch.library.custom_op`, whose wrapper imports
# torch._dynamo on first call: seconds of start-up, and a compiler loaded into the runtime).
LIBRARY = torch.library.Library("atom", "DEF")
LIBRARY.define(
    "paged_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) kv_cache, int layer, Tensor slot_mapping, "
    "Tensor block_tables, Tensor seq_lens, Tensor query_start_loc, float scale, Tensor? kv_scale=None, "
    "Tensor? sinks=None, int? sliding_window=None) -> Tensor")


def paged_attention_reference(
    q: torch.Tensor,              # [T, H, D]
    k: torch.Tensor,              # [T, Hkv, D]
    v: torch.Tensor,              # [T, Hkv, D]
    kv_cache: torch.Tensor,       # [L, 2, num_blocks, block_size, Hkv, D]
    layer: int,
    slot_mapping: torch.Tensor,   # [T] int64
    block_tables: torch.Tensor,   # [B, max_blocks] int32
    seq_lens: torch.Tensor,       # [B] int32: tokens in context once this step's are written
    query_start_loc: torch.Tensor,  # [B + 1] int32: the batch's tokens of sequence b are q[start[b]:start[b+1]]
    scale: float,
    kv_scale: torch.Tensor | None = None,   # [2] float32 (k, v) for an fp8 cache
    sinks: torch.Tensor | None = None,      # [H]: each head's sink logit (module docstring)
    sliding_window: int | None = None,      # keys within this many positions of the query, itself included
) -> torch.Tensor:
    write_kv_cache(kv_cache[layer], k, v, slot_mapping, kv_scale)
    return reference_attention(q, kv_cache[layer], block_tables, seq_lens, query_start_loc, scale, kv_scale,
                               sinks, sliding_window)


# CUDA too: the build calibrates fp8 KV scales by running the model on the reference backend
for _key in ("CPU", "CUDA"):
    LIBRARY.impl("paged_attention", paged_attention_reference, _key)


@torch.library.register_fake("atom::paged_attention", lib=LIBRARY)
def _(q, k, v, kv_cache, layer, slot_mapping, block_tables, seq_lens, query_start_loc, scale, kv_scale=None,
      sinks=None, sliding_window=None):
    return torch.empty_like(q)


paged_attention = torch.ops.atom.paged_attention


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """Rows as the cache stores them: divided by the scale and clamped to e4m3's range when scaled."""
    if scale is None:
        return x.to(cache_dtype)
    fp8_max = torch.finfo(cache_dtype).max
    return (x.float() / scale).clamp(-fp8_max, fp8_max).to(cache_dtype)


def from_cache(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    return x.to(dtype) if scale is None else (x.float() * scale).to(dtype)


def write_kv_cache(kv_layer: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor,
                   kv_scale: torch.Tensor | None = None) -> None:
    """Scatter the new k/v rows into their slots; padded tokens (slot -1) are dropped."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_layer.shape
    flat = kv_layer.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_scale, v_scale = (None, None) if kv_scale is None else (kv_scale[0], kv_scale[1])
    k, v = to_cache(k[valid], kv_layer.dtype, k_scale), to_cache(v[valid], kv_layer.dtype, v_scale)
    if kv_layer.element_size() == 1:   # index_copy_ has no float8 kernel: move the bytes instead
        flat, k, v = flat.view(torch.uint8), k.view(torch.uint8), v.view(torch.uint8)
    flat[0].index_copy_(0, slots, k)
    flat[1].index_copy_(0, slots, v)


def reference_attention(q, kv_layer, block_tables, seq_lens, query_start_loc, scale, kv_scale=None, sinks=None,
                        sliding_window=None) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached context, in plain torch.

    The new tokens of a sequence with context length L are its last n_q positions, so query i
    sees keys 0 .. L - n_q + i (the last `sliding_window` of them where a window is given).
    """
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for b, context_len in enumerate(lens):
        first, last = starts[b], starts[b + 1]
        if last > first:
            keys, values = gather_context(kv_layer, block_tables[b], context_len)
            if kv_scale is not None:
                keys, values = from_cache(keys, q.dtype, kv_scale[0]), from_cache(values, q.dtype, kv_scale[1])
            out[first:last] = _causal_attention(q[first:last], keys, values, scale, sinks, sliding_window)
    return out


def gather_context(kv_layer: torch.Tensor, block_table: torch.Tensor, context_len: int):
    """The first `context_len` keys and values of one sequence: 2 x [context_len, Hkv, D]."""
    block_size = kv_layer.shape[2]
    num_blocks = -(-context_len // block_size)
    blocks = block_table[:num_blocks].long()
    keys = kv_layer[0, blocks].flatten(0, 1)[:context_len]
    values = kv_layer[1, blocks].flatten(0, 1)[:context_len]
    return keys, values


def _causal_attention(q, keys, values, scale, sinks=None, sliding_window=None):
    # q: [n_q, H, D]; keys/values: [L, Hkv, D]
    n_q, context_len = q.shape[0], keys.shape[0]
    query_pos = torch.arange(n_q, device=q.device)[:, None] + (context_len - n_q)
    key_pos = torch.arange(context_len, device=q.device)[None, :]
    mask = key_pos <= query_pos                                              # [n_q, L]
    if sliding_window is not None:
        mask &= key_pos > query_pos - sliding_window
    group = q.shape[1] // keys.shape[1]
    k = keys.to(q.dtype).transpose(0, 1).repeat_interleave(group, dim=0)   # [H, L, D]
    v = values.to(q.dtype).transpose(0, 1).repeat_interleave(group, dim=0)
    if sinks is not None:
        return _attention_with_sinks(q.transpose(0, 1), k, v, mask, scale, sinks).transpose(0, 1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask, scale=scale)
    return o.transpose(0, 1)


def _attention_with_sinks(q, k, v, mask, scale, sinks):
    """softmax over [q.k * scale, sink] per row, the sink's column dropped, times v; in transformers' order of
    operations (GPT-OSS's eager attention), so float32 results match it. q: [H, n_q, D]; k, v: [H, L, D]."""
    logits = torch.matmul(q, k.transpose(1, 2)) * scale                       # [H, n_q, L]
    logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
    sink = sinks.to(logits.dtype).reshape(-1, 1, 1).expand(-1, logits.shape[1], 1)
    combined = torch.cat([logits, sink], dim=-1)
    combined = combined - combined.max(dim=-1, keepdim=True).values
    probs = torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)
