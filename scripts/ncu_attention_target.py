"""One decode-attention launch sequence for Nsight Compute to profile: a random Llama-3.1-8B-shaped paged
batch (32 q heads, 8 kv heads, D 128, block 16) at batch x context, the cache in bf16 or fp8
(fp16 dots), one config, three launches (ncu profiles the last: --launch-skip 2).

    python3 scripts/ncu_attention_target.py fp8 16,128,4,2,512,16 [--batch 256 --context 1024] [--maxnreg 128]
    ncu --clock-control none --kernel-name regex:paged_attention_kernel --launch-skip 2 --launch-count 1 \
        --set full -o REPORT python3 scripts/ncu_attention_target.py fp8 CONFIG
"""
from __future__ import annotations

import argparse

import torch

from atom_aot.ops.triton.batch_inputs import make_paged_batch
from atom_aot.ops.triton.paged_attention import AttentionConfig, launch_paged_attention


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cache", choices=("bf16", "fp8"))
    ap.add_argument("config", help="block_m,block_n,num_warps,num_stages,target_programs,max_splits")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--maxnreg", type=int, default=None)
    a = ap.parse_args()
    dtype = torch.float8_e4m3fn if a.cache == "fp8" else torch.bfloat16
    b = make_paged_batch([a.context] * a.batch, [1] * a.batch, 8, 128, num_layers=1, dtype=dtype, device="cuda")
    q = torch.randn(a.batch, 32, 128, device="cuda", dtype=torch.bfloat16)
    scale = torch.tensor([0.5, 2.0], device="cuda") if a.cache == "fp8" else None
    config = AttentionConfig(*map(int, a.config.split(",")))
    for _ in range(3):
        launch_paged_attention(q, b.kv_cache, 0, b.block_tables, b.seq_lens, b.query_start_loc, 128 ** -0.5,
                               *config.as_args(), kv_scale=scale, maxnreg=a.maxnreg)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
