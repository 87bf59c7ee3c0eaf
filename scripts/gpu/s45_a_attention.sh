#!/usr/bin/env bash
# Session 45, one H100, call A (carry .whl): decode and prefill attention over fp8 caches whose value pages are
# key-minor ([Hkv, D, block]) against the standard pages and bf16 (scripts/bench_fp8_attention.py).
LOGS=/tmp/s45; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 400 python3 scripts/bench_fp8_attention.py --out $OUT/fp8-attention.json --budget-s 340 > $OUT/fp8-attention.log 2>&1
at "bench rc=$?"
tail -60 $OUT/fp8-attention.log
