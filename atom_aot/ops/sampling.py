"""The sampler's masks as one threshold per row (the contract the Triton kernel in
ops/triton/sampling_threshold.py computes without sorting; this is its torch reference).

Top-k, then top-p, then min-p each keep the tokens whose logit is at least some value, so together
they keep the tokens at or above the largest of the three: the k-th largest logit; the logit of the
token with which the most likely tokens of the top-k set first reach `top_p` of that set's mass (the
nucleus); the largest logit plus log(min_p) (a token at least `min_p` times as likely as the most
likely). A row keeps every token tied with its threshold. The most likely token always stays.
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
    mass = ordered.masked_fill(ordered < t_k.unsqueeze(-1), NEG_INF).softmax(dim=-1).cumsum(dim=-1)
    reached = mass >= top_p.unsqueeze(-1)
    first = reached.to(torch.int8).argmax(dim=-1, keepdim=True)       # the first position reaching top_p
    # top_p < 1 whose mass rounds below it everywhere keeps the whole top-k set
    t_p = torch.where((top_p < 1) & reached.any(dim=-1), ordered.gather(-1, first).squeeze(-1), NEG_INF)
    t_m = torch.where(min_p > 0, ordered[:, 0] + min_p.clamp(min=1e-38).log(), NEG_INF)
    return torch.maximum(torch.maximum(t_k, t_p), t_m)


def mask_below(logits: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """logits [N, V] with every entry below its row's threshold [N] set to -inf."""
    return logits.masked_fill(logits < threshold.unsqueeze(-1), NEG_INF)
