#!/usr/bin/env bash
# Session 45, one H100, call A (carry .whl): decode attention sweeps (scripts/bench_fp8_attention.py). Second run:
# fp8 caches with the kernel's registers capped (ptxas maxnreg) against ptxas' own choice: does residency bound fp8?
LOGS=/tmp/s45; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 400 python3 scripts/bench_fp8_attention.py --out $OUT/fp8-attention.json --budget-s 300 > $OUT/fp8-attention.log 2>&1
at "bench rc=$?"
tail -60 $OUT/fp8-attention.log
