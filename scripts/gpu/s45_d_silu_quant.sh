#!/usr/bin/env bash
# Session 45, one H100, call D (carry .whl): one-pass SiLU-mul + per-token fp8 quantization against Inductor's
# code for the same (scripts/bench_silu_mul_quant.py): does a fused op pay before it is built into the model?
LOGS=/tmp/s45; source scripts/gpu/prelude.sh
timeout 280 python3 scripts/bench_silu_mul_quant.py --out $OUT/silu-quant.json > $OUT/silu-quant.log 2>&1
at "bench rc=$?"; tail -8 $OUT/silu-quant.log | cut -c1-400
