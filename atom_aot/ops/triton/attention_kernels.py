"""Triton kernels of paged attention: one tile kernel for every kind of batch, and a merge kernel.

Work decomposition (grid = (num_tiles, Hkv, num_splits), all from shapes and ints):

    a tile = BLOCK_Q consecutive query tokens of ONE sequence x the GROUP q heads that share one
             kv head, flattened to BLOCK_M = BLOCK_Q * GROUP_PAD rows (row r: token r // GROUP_PAD,
             head r % GROUP_PAD), so every K/V tile loaded from the cache serves the whole group.

    sequence b owns tiles [start[b] // BLOCK_Q + b, start[b+1] // BLOCK_Q + b + 1): at least
    ceil(n_q / BLOCK_Q) of them, so T // BLOCK_Q + B + 1 tiles cover any batch of T tokens; the
    "+1" is a pseudo-sequence B holding the padding rows start[B] .. T-1, written as zeros.
    A program finds its sequence by binary search over query_start_loc and returns at once when
    its tile lies past the sequence's last query (the grid is an upper bound, not a count).

Split-K (flash-decoding): `num_splits` is a runtime value (the op derives it from the batch size,
so one compiled decode graph splits at batch 1 and not at batch 256). Split s of num_splits takes
an equal share of the tile's key blocks. With one split the tile kernel writes the final output;
with more it writes a normalized partial output plus its log2-sum-exp, and `merge_splits_kernel`
combines them.

Page ids ahead (PREFETCH_PAGES; the op sets it for configs of 3+ stages): in the unmasked loop each iteration
reads the block table's entries for the NEXT key block and uses the ones the previous iteration read, so its cache
reads never wait on a table read; Triton's pipeliner then also keeps num_stages - 1 key blocks in flight (without
it the stages go to the table-then-cache indirection and one block is in flight). Measured on an H100
(docs/benchmarks/h100-attention-prefetch-2026-11-26.json), best config each: fp8 decode at batch 64-256 4.6-6.1% faster,
bf16 prefill 5-10% faster, bf16 decode unchanged; fp8 prefill 1-3% slower at 2 stages, hence the tie to stages.

An fp8 cache's scales (KV_SCALED) cost nothing in the loop: keys are widened in registers and
k_scale folds into the softmax scale; v_scale multiplies the tile's accumulator once.
FP8_AS_FP16: with an fp8 cache and bf16 queries the two dots run in fp16 (q converted once per tile):
e4m3 -> fp16 is one hardware conversion per pair of values, e4m3 -> bf16 is not, and fp16 holds every
e4m3 value and the probabilities exactly enough (more mantissa than bf16).

Sinks (HAS_SINKS; GPT-OSS): split 0 of each tile starts its online softmax as if it had already seen one key
whose logit is the row's head's sink and whose value is 0 (m = sink, l = 1, acc = 0), so the sink takes its
share of the denominator once, and the merge weighs the splits by log-sum-exps that count it once.
Sliding window (SLIDING; `window` W): a query at position p sees keys p - W + 1 .. p. The tile's key blocks
start at the block of its first query's first visible key (earlier blocks are not read, nor split over), the
blocks holding keys that some rows of the tile no longer see run masked, then the full blocks unmasked, then the
diagonal masked as without a window.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)        # the same, as the kernels read it


@triton.jit
def _find_sequence(query_start_loc_ptr, tile, num_seqs, BLOCK_Q: tl.constexpr):
    """The largest b in [0, num_seqs] whose first tile (start[b] // BLOCK_Q + b) is <= tile."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi + 1) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def _locate_tile(query_start_loc_ptr, tile, num_seqs, num_tokens, BLOCK_Q: tl.constexpr):
    """(b, q_start, q_end, q_first): the tile's sequence (num_seqs: the padding pseudo-sequence), that
    sequence's query rows [q_start, q_end), and the tile's first row (>= q_end: nothing to do)."""
    b = _find_sequence(query_start_loc_ptr, tile, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + b)
    q_end = tl.load(query_start_loc_ptr + b + 1, mask=b < num_seqs, other=num_tokens)
    q_first = q_start + (tile - (q_start // BLOCK_Q + b)) * BLOCK_Q
    return b, q_start, q_end, q_first


@triton.jit
def _key_blocks(seq_lens_ptr, b, num_seqs, q_start, q_end, q_first, split, num_splits, window,
                BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, SLIDING: tl.constexpr):
    """(context, kv_len, kb_lo, kb_hi): tokens cached before this step's queries, the keys the tile's
    last query sees, and this split's key blocks [kb_lo, kb_hi): from the block of the first key the tile's first
    query sees (0 without a window). The padding pseudo-sequence sees none."""
    is_real = b < num_seqs
    seq_len = tl.load(seq_lens_ptr + b, mask=is_real, other=0)
    context = seq_len - (q_end - q_start)
    kv_len = tl.where(is_real, context + tl.minimum(q_first + BLOCK_Q, q_end) - q_start, 0)
    num_kv_blocks = tl.cdiv(kv_len, BLOCK_N)
    kb_first = 0
    if SLIDING:
        kb_first = tl.minimum(tl.maximum(context + (q_first - q_start) - window + 1, 0) // BLOCK_N, num_kv_blocks)
    per_split = tl.cdiv(num_kv_blocks - kb_first, num_splits)
    kb_lo = kb_first + split * per_split
    kb_hi = tl.minimum(kb_lo + per_split, num_kv_blocks)
    return context, kv_len, kb_lo, kb_hi


@triton.jit
def _attend_blocks(q, cache, table, kb_lo, kb_hi, kv_len, q_pos, window, dims, dim_ok, qk_scale_log2, acc, l_i, m_i,
                   stride_ckv, stride_cblk, stride_crow,
                   BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr,
                   PREFETCH_PAGES: tl.constexpr, SLIDING: tl.constexpr):
    """Online softmax (base 2) of q [BLOCK_M, D] over key blocks [kb_lo, kb_hi), continuing (acc, l_i, m_i).

    MASKED false: the caller guarantees every key of these blocks is < kv_len and visible to every row
    (a block wholly before the tile's first query and inside every row's window), so the loop carries no
    causal, window or length mask and no guard for rows that see no key: the off-diagonal bulk of a prefill
    tile, and all but the last block of a decode step. There the block table's entries for the next block are
    read one iteration ahead (PREFETCH_PAGES): otherwise each iteration waits for its page ids before it can ask
    for its keys."""
    offsets = tl.arange(0, BLOCK_N)
    if PREFETCH_PAGES and not MASKED:
        next_page = tl.load(table + (kb_lo * BLOCK_N + offsets) // PAGE_SIZE, mask=kb_lo < kb_hi, other=0)
    for kb in range(kb_lo, kb_hi):
        keys = kb * BLOCK_N + offsets                       # [BLOCK_N] key positions
        if MASKED:
            key_ok = keys < kv_len
            page = tl.load(table + keys // PAGE_SIZE, mask=key_ok, other=0).to(tl.int64)
            k_mask = key_ok[None, :] & dim_ok[:, None]
            v_mask = key_ok[:, None] & dim_ok[None, :]
        else:
            if PREFETCH_PAGES:
                page = next_page.to(tl.int64)
                next_page = tl.load(table + (keys + BLOCK_N) // PAGE_SIZE, mask=kb + 1 < kb_hi, other=0)
            else:
                page = tl.load(table + keys // PAGE_SIZE).to(tl.int64)
            k_mask = dim_ok[:, None]
            v_mask = dim_ok[None, :]
        slot = page * stride_cblk + (keys % PAGE_SIZE) * stride_crow
        # k: [D, BLOCK_N] (transposed by addressing); v: [BLOCK_N, D]; fp8 caches widen here
        k = tl.load(cache + slot[None, :] + dims[:, None], mask=k_mask, other=0.0).to(q.dtype)
        v = tl.load(cache + stride_ckv + slot[:, None] + dims[None, :], mask=v_mask, other=0.0).to(q.dtype)
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        s = s * tl.cast(qk_scale_log2, tl.float32)                 # [BLOCK_M, BLOCK_N]; Inductor passes floats as fp64
        if MASKED:
            visible = (keys[None, :] <= q_pos[:, None]) & key_ok[None, :]
            if SLIDING:
                visible = visible & (keys[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASKED:
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # rows that see no key yet
        else:
            m_safe = m_new
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if IEEE:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attend(q, cache, table, kb_lo, kb_hi, kv_len, first_pos, q_pos, window, dims, dim_ok, qk_scale_log2, l_i, m_i,
            stride_ckv, stride_cblk, stride_crow,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, PAGE_SIZE: tl.constexpr,
            IEEE: tl.constexpr, PREFETCH_PAGES: tl.constexpr, SLIDING: tl.constexpr):
    """Online softmax of q over key blocks [kb_lo, kb_hi), from (l_i, m_i): (acc, l_i, m_i) in fp32. With a window,
    the blocks holding a key that the tile's last query (at kv_len - 1) no longer sees run masked first. The
    blocks that end at or before `first_pos` (the tile's first query position, which every row's query is at or
    after) are full: they run unmasked; the rest (the diagonal and the last, partial block) run masked."""
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    lead_hi = kb_lo
    if SLIDING:
        lead_hi = tl.maximum(tl.minimum(tl.cdiv(tl.maximum(kv_len - window, 0), BLOCK_N), kb_hi), kb_lo)
    full_hi = tl.maximum(tl.minimum((first_pos + 1) // BLOCK_N, kb_hi), lead_hi)
    acc, l_i, m_i = _attend_blocks(q, cache, table, kb_lo, lead_hi, kv_len, q_pos, window, dims, dim_ok,
                                   qk_scale_log2, acc, l_i, m_i, stride_ckv, stride_cblk, stride_crow, BLOCK_N,
                                   PAGE_SIZE, IEEE, True, PREFETCH_PAGES, SLIDING)
    acc, l_i, m_i = _attend_blocks(q, cache, table, lead_hi, full_hi, kv_len, q_pos, window, dims, dim_ok,
                                   qk_scale_log2, acc, l_i, m_i, stride_ckv, stride_cblk, stride_crow, BLOCK_N,
                                   PAGE_SIZE, IEEE, False, PREFETCH_PAGES, SLIDING)
    acc, l_i, m_i = _attend_blocks(q, cache, table, full_hi, kb_hi, kv_len, q_pos, window, dims, dim_ok,
                                   qk_scale_log2, acc, l_i, m_i, stride_ckv, stride_cblk, stride_crow, BLOCK_N,
                                   PAGE_SIZE, IEEE, True, PREFETCH_PAGES, SLIDING)
    return acc, l_i, m_i


@triton.jit
def _softmax_start(sinks_ptr, head, head_ok, split, BLOCK_M: tl.constexpr, HAS_SINKS: tl.constexpr):
    """(l_i, m_i) before any key: nothing seen, or, in split 0 with sinks, the sink as one key of value 0 (its
    logit in base 2 as the max, weight 1)."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if HAS_SINKS:
        if split == 0:
            m_i = tl.load(sinks_ptr + head, mask=head_ok, other=0.0).to(tl.float32) * _LOG2E
            l_i = tl.full([BLOCK_M], 1.0, tl.float32)
    return l_i, m_i


@triton.jit
def _store_tile(out_ptr, part_ptr, lse_ptr, acc, l_i, m_i, tok64, head, dims, row_ok, dim_ok, split, num_splits,
                stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, MAY_SPLIT: tl.constexpr):
    """The tile's normalized output: into out with one split, else a partial and its log2-sum-exp
    (-inf where a row saw no key in this split, so the merge weighs it 0; all zeros when none saw any).
    Kernels that never split (MAY_SPLIT false) carry only the first path, and its registers."""
    has_keys = l_i > 0.0
    o = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    io_mask = row_ok[:, None] & dim_ok[None, :]
    if (not MAY_SPLIT) or num_splits == 1:
        tl.store(out_ptr + tok64[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=io_mask)
    else:
        tl.store(part_ptr + tok64[:, None] * stride_pt + head[:, None] * stride_ph + split * stride_ps
                 + dims[None, :], o, mask=io_mask)
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + tok64 * stride_lt + head * stride_lh + split, lse, mask=row_ok)


@triton.jit
def paged_attention_kernel(
    q_ptr, kv_ptr, out_ptr, part_ptr, lse_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    kv_scale_ptr,                       # [2] float32 (k, v) when KV_SCALED
    sinks_ptr,                          # [H] sink logits when HAS_SINKS
    qk_scale_log2,                      # softmax scale * log2(e): the kernel works in base 2
    num_tokens, num_seqs, num_splits,   # num_splits: runtime, the grid's third axis
    window,                             # SLIDING: a query sees the last `window` keys, itself included
    layer_offset,                       # layer * kv_cache.stride(0)
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_pt, stride_ph, stride_ps,    # partials [T, H, num_splits, D] fp32 (unused with one split)
    stride_lt, stride_lh,               # their log2-sum-exp [T, H, num_splits] fp32
    stride_ckv, stride_cblk, stride_crow, stride_ch,   # kv_cache strides (last dim dense)
    stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, PAGE_SIZE: tl.constexpr, IEEE: tl.constexpr,
    MAY_SPLIT: tl.constexpr,            # the op's max_splits > 1
    KV_SCALED: tl.constexpr,            # fp8 cache with scales: stored * scale is the value
    FP8_AS_FP16: tl.constexpr,          # fp8 cache, bf16 q: the dots run in fp16 (see the module docstring)
    PREFETCH_PAGES: tl.constexpr,       # read the next key block's page ids one iteration ahead (_attend_blocks)
    HAS_SINKS: tl.constexpr,            # per-head sink logits join the softmax (module docstring)
    SLIDING: tl.constexpr,              # a sliding window (module docstring)
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_PAD
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    b, q_start, q_end, q_first = _locate_tile(query_start_loc_ptr, tile, num_seqs, num_tokens, BLOCK_Q)
    if q_first >= q_end:
        return

    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM_PAD)
    tok = q_first + rows // GROUP_PAD                       # [BLOCK_M] query token of each row
    head_in_group = rows % GROUP_PAD
    head = kv_head * GROUP + head_in_group
    row_ok = (tok < q_end) & (head_in_group < GROUP)
    dim_ok = dims < HEAD_DIM
    tok64 = tok.to(tl.int64)

    context, kv_len, kb_lo, kb_hi = _key_blocks(seq_lens_ptr, b, num_seqs, q_start, q_end, q_first, split,
                                                num_splits, window, BLOCK_Q, BLOCK_N, SLIDING)
    q_pos = context + (tok - q_start)                       # [BLOCK_M] absolute position of each query
    # q: [BLOCK_M, D]
    q = tl.load(q_ptr + tok64[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    if FP8_AS_FP16:   # |q| past fp16's range would be inf: saturate (never seen in a real model's q)
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0).to(tl.float16)
    qk_scale = tl.cast(qk_scale_log2, tl.float32)
    if KV_SCALED:
        qk_scale = qk_scale * tl.load(kv_scale_ptr)
    l_i, m_i = _softmax_start(sinks_ptr, head, head_in_group < GROUP, split, BLOCK_M, HAS_SINKS)
    acc, l_i, m_i = _attend(q, kv_ptr + layer_offset + kv_head * stride_ch, block_tables_ptr + b * stride_bt,
                            kb_lo, kb_hi, kv_len, context + (q_first - q_start), q_pos, window, dims, dim_ok,
                            qk_scale, l_i, m_i, stride_ckv, stride_cblk, stride_crow, BLOCK_M, BLOCK_N, HEAD_DIM_PAD,
                            PAGE_SIZE, IEEE, PREFETCH_PAGES, SLIDING)
    if KV_SCALED:
        acc = acc * tl.load(kv_scale_ptr + 1)
    _store_tile(out_ptr, part_ptr, lse_ptr, acc, l_i, m_i, tok64, head, dims, row_ok, dim_ok, split, num_splits,
                stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, MAY_SPLIT)


@triton.jit
def merge_splits_kernel(
    part_ptr, lse_ptr, out_ptr, num_splits,
    stride_pt, stride_ph, stride_ps,
    stride_lt, stride_lh,
    stride_ot, stride_oh,
    SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    """out[t, h] = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M) over s < num_splits; one program per
    (token, head). SPLITS_PAD covers the op's max_splits; the lanes past this batch's count are masked."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    split_ok = splits < num_splits
    lse = tl.load(lse_ptr + t * stride_lt + h * stride_lh + splits, mask=split_ok, other=float("-inf"))
    top = tl.max(lse, 0)
    weight = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top))   # [SPLITS_PAD]; all 0 if no key at all
    part = tl.load(part_ptr + t * stride_pt + h * stride_ph + splits[:, None] * stride_ps + dims[None, :],
                   mask=split_ok[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)   # [SPLITS_PAD, D]
    total = tl.sum(weight, 0)
    out = tl.sum(part * weight[:, None], 0) / tl.where(total > 0.0, total, 1.0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)
