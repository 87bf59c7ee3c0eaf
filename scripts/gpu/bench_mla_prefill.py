"""Times the MLA prefill attention of one layer at DeepSeek-V3's shapes (128 heads, r 512, rope 64, nope 128,
v 128) on the GPU: the reference op's naive form with its boolean mask, the same with `is_causal` (no
cached prefix), and with the values padded to the query/key width (what flash kernels need), per sequence
of 1024 tokens; and the whole `atom::mla_attention` reference op on a step of 16 such prefills.

  python scripts/gpu/bench_mla_prefill.py --out FILE.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from atom_aot.ops.mla import causal_mask, mla_prefill_naive

H, R, ROPE, NOPE, V = 128, 512, 64, 128, 128


def timed(fn, iters=10) -> float:
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--four-d", action="store_true")
    a = p.parse_args()
    dev, dt, n = "cuda", torch.bfloat16, a.tokens
    g = torch.Generator(device=dev).manual_seed(0)
    q_nope = torch.randn(n, H, NOPE, device=dev, dtype=dt, generator=g)
    q_pe = torch.randn(n, H, ROPE, device=dev, dtype=dt, generator=g)
    latent = torch.randn(n, R + ROPE, device=dev, dtype=dt, generator=g)
    w_uk = torch.randn(H, NOPE, R, device=dev, dtype=dt, generator=g) * R ** -0.5
    w_uv = torch.randn(H, R, V, device=dev, dtype=dt, generator=g) * R ** -0.5
    scale = (NOPE + ROPE) ** -0.5
    c_kv, k_pe = latent[:, :R], latent[:, R:]
    k_nope = torch.einsum("lr,hnr->hln", c_kv, w_uk)
    values = torch.einsum("lr,hrv->hlv", c_kv, w_uv)
    keys = torch.cat([k_nope, k_pe.unsqueeze(0).expand(H, -1, -1)], dim=-1)
    queries = torch.cat([q_nope, q_pe], dim=-1).transpose(0, 1)
    mask = causal_mask(n, n, dev)
    padded = F.pad(values, (0, NOPE + ROPE - V))
    if a.four_d:               # [1, H, n, d]: SDPA's fused kernels take 4-d tensors only (3-d runs the math path)
        queries, keys, values, padded = queries[None], keys[None], values[None], padded[None]
    out = {"device": torch.cuda.get_device_name(0), "tokens": n, "heads": H, "four_d": a.four_d, "ms": {}}
    ms = out["ms"]
    ms["naive_whole (as shipped)"] = timed(lambda: mla_prefill_naive(q_nope, q_pe, latent, w_uk, w_uv, scale))
    ms["up_projections_and_cat"] = timed(lambda: (torch.einsum("lr,hnr->hln", c_kv, w_uk), torch.einsum("lr,hrv->hlv", c_kv, w_uv),
                                                  torch.cat([k_nope, k_pe.unsqueeze(0).expand(H, -1, -1)], dim=-1)))
    ms["sdpa_bool_mask"] = timed(lambda: F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale))
    ms["sdpa_is_causal"] = timed(lambda: F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale))
    ms["sdpa_is_causal_v_padded"] = timed(lambda: F.scaled_dot_product_attention(queries, keys, padded, is_causal=True, scale=scale))
    ref = F.scaled_dot_product_attention(queries.float(), keys.float(), values.float(), attn_mask=mask, scale=scale)
    for name, o in {"is_causal": F.scaled_dot_product_attention(queries, keys, values, is_causal=True, scale=scale),
                    "v_padded": F.scaled_dot_product_attention(queries, keys, padded, is_causal=True, scale=scale)[..., :V]}.items():
        out[f"max_abs_err_{name}_vs_fp32"] = float((o.float() - ref).abs().max())
    from torch.nn.attention import SDPBackend, sdpa_kernel
    cases = {"is_causal_v128": (values, None), "is_causal_v_padded": (padded, None), "bool_mask": (values, mask)}
    for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        for name, (v, attn_mask) in cases.items():
            try:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    ms[f"sdpa_{name}_{backend}"] = timed(lambda: F.scaled_dot_product_attention(
                        queries, keys, v, attn_mask=attn_mask, is_causal=attn_mask is None, scale=scale))
            except RuntimeError as e:          # "No available kernel" for shapes a backend does not take
                ms[f"sdpa_{name}_{backend}"] = f"{type(e).__name__}: {str(e)[:120]}"
        json.dump(out, open(a.out, "w"), indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
