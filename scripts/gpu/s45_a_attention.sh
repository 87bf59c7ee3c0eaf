#!/usr/bin/env bash
# Session 45, one H100, call A (carry .whl): a decode attention sweep (scripts/bench_fp8_attention.py). Run four
# times with the script as it stood: value pages key-minor and head-major, then key-minor with e4m3 dots (both at
# commit 48256d9), then ptxas' register cap (maxnreg), then the page ids read ahead (the JSONs under
# docs/benchmarks/h100-s45-*.json say which run is which).
LOGS=/tmp/s45; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 400 python3 scripts/bench_fp8_attention.py --out $OUT/fp8-attention.json --budget-s 300 > $OUT/fp8-attention.log 2>&1
at "bench rc=$?"
tail -60 $OUT/fp8-attention.log
