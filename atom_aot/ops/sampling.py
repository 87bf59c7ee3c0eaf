"""The sampler's masks as one threshold per row (the contract the Triton kernel in
ops/triton/sampling_threshold.py computes without sorting; this is its torch reference).

Top-k, then top-p, then min-p each keep the tokens whose logit is at least some value, so together
they keep the tokens at or above the largest of the three: the k-th largest logit; the logit of the
token with which the most likely tokens of the top-k set first reach `top_p` of that set's mass (the
nucleus); the largest logit plus log(min_p) (a token at least `min_p` times as likely as the most
likely). A row keeps every token tied with its threshold. The most likely token always stays.

Precision, so that the kernel and this reference agree bit for bit: a token's mass is exp(logit - max)
in float32 as torch computes it (the kernel calls libdevice's exp, the CUDA math library's expf that
torch's CUDA exp calls too); the masses are summed in float64 (cumulative sums from the most likely; the
set's total is the last), and a prefix reaches the nucleus when its sum >= top_p * total in float64.
Summed in another order, a prefix can land on the other side only when it lies within ~1e-15 relative of
top_p * total (with float32 sums and Triton's fast exp, kernel and reference disagreed at 64 rows of
151,936 logits). Top-k is a count: exact.
"""
from __future__ import annotations

import torch

NEG_INF = float("-inf")


def sampling_threshold(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       min_p: torch.Tensor) -> torch.Tensor:
    """logits [N, V] float32; top_k [N] int64 (<= 0 or >= V: none), top_p [N] float32 (>= 1: none), min_p [N]
    float32 (<= 0: none) -> [N] float32: keep the tokens with logit >= it (-inf: all)."""
    vocab = logits.shape[-1]
    ordered = logits.sort(dim=-1, descending=True).values
    has_k = (top_k > 0) & (top_k < vocab)
    kth = ordered.gather(-1, (torch.where(has_k, top_k, 1) - 1).unsqueeze(-1)).squeeze(-1)
    t_k = torch.where(has_k, kth, NEG_INF)
    kept = ordered.masked_fill(ordered < t_k.unsqueeze(-1), NEG_INF)
    mass = (kept - ordered[:, :1]).exp().double().cumsum(dim=-1)        # float32 exp, float64 sums
    reached = mass >= top_p.double().unsqueeze(-1) * mass[:, -1:]
    first = reached.to(torch.int8).argmax(dim=-1, keepdim=True)       # the first position reaching top_p
    # top_p < 1 always reaches by the last token, unless the row is all -inf (NaN masses): all kept
    t_p = torch.where((top_p < 1) & reached.any(dim=-1), ordered.gather(-1, first).squeeze(-1), NEG_INF)
    t_m = torch.where(min_p > 0, ordered[:, 0] + min_p.clamp(min=1e-38).log(), NEG_INF)
    return torch.maximum(torch.maximum(t_k, t_p), t_m)


def mask_below(logits: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """logits [N, V] with every entry below its row's threshold [N] set to -inf."""
    return logits.masked_fill(logits < threshold.unsqueeze(-1), NEG_INF)
