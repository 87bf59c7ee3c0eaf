"""Rotary position embedding: the cos/sin table (computed by the build, stored with the weights)
and the rotations the reference attention backends apply: neox-style (halves) for the dense
families, on the first part of each head only for partial rotary (GLM-4-MoE), interleaved pairs for
DeepSeek's decoupled rope.

YaRN (`rope_type: yarn`, DeepSeek-V2/V3) follows HF's `_compute_yarn_parameters`: blended
inverse frequencies, an attention factor folded into the cos/sin table, and (DeepSeek's
`mscale_all_dim`) a correction of the softmax scale, `yarn_softmax_scale`.
"""
from __future__ import annotations

import math

import torch


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """Inverse frequencies, with the `llama3`, `linear` or `yarn` scaling rules of HF's rope utils."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "yarn":
        return _yarn_inverse_frequencies(head_dim, theta, scaling)
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type != "llama3":
        return inv_freq
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inverse_frequencies(head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """Extrapolated frequencies for the fast dimensions, interpolated (/ factor) for the slow ones,
    a linear ramp between the correction range that beta_fast / beta_slow rotations bound."""
    factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations):
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001   # HF's guard against a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(scaling: dict) -> float:
    """The factor YaRN multiplies cos and sin by (1 for the other rope types)."""
    if scaling.get("rope_type", "default") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
    return _yarn_mscale(factor)


def yarn_softmax_scale(scale: float, scaling: dict) -> float:
    """DeepSeek's softmax scale under scaled rope: `scale * mscale(factor, mscale_all_dim)**2`."""
    mscale_all_dim = scaling.get("mscale_all_dim", 0)
    if scaling.get("rope_type", "default") == "default" or not mscale_all_dim:
        return scale
    return scale * _yarn_mscale(scaling["factor"], mscale_all_dim) ** 2


def rope_cos_sin_cache(head_dim: int, theta: float, scaling: dict, max_positions: int) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half, sin in the second (YaRN's attention
    factor already applied). `head_dim`: the rotated dims (the rotary dim of a partial rotary)."""
    inv_freq = rope_inverse_frequencies(head_dim, theta, scaling)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    attention_factor = rope_attention_factor(scaling)
    return torch.cat([freqs.cos() * attention_factor, freqs.sin() * attention_factor], dim=-1)


def apply_rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor):
    """Neox-style rotation of q: [T, H, D] and k: [T, Hkv, D] at positions: [T].

    The table's width R (cos_sin_cache [P, R]) is the rotated part: the first R dims of each head, their
    halves paired (dim i with i + R/2), the other D - R dims passed through. R = D but for partial rotary
    (`partial_rotary_factor`, GLM-4-MoE: R = D/2), as transformers' `apply_rotary_pos_emb` there.
    """
    cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, R/2]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotary = 2 * cos.shape[-1]
    x1, x2 = x[..., :rotary].float().chunk(2, dim=-1)
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    return rotated if rotary == x.shape[-1] else torch.cat([rotated, x[..., rotary:]], dim=-1)


def apply_rope_interleaved(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """DeepSeek's rotation of interleaved pairs (x0, x1), (x2, x3), ... of x: [T, H, D] at positions: [T].

    As HF's `apply_rotary_pos_emb_interleave`, the result is written de-interleaved (all rotated
    first members, then all second members); q and k both come out so, so their dot product is
    the same, and the latent cache stores k in this order.
    """
    cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D/2]
    h = x.float()
    x1, x2 = h[..., 0::2], h[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
