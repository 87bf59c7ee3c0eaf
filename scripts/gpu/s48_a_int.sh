#!/usr/bin/env bash
# Session 48, one H100, one call (carry .whl): the int4 / int8 GPU paths, never run on a GPU before: their Triton
# kernel tests on CUDA (float64 references), then scripts/bench_int4.py and bench_int8.py (check against the CPU
# reference, then time against bf16 cuBLAS on Llama-3.1-8B's linear shapes).
LOGS=/tmp/s48; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_triton_int4_gemm.py tests/test_triton_int8_small_m.py \
  > $OUT/gpu-int-tests.log 2>&1
at "kernel tests rc=$?"; grep -E "passed|failed|^FAILED|^E " $OUT/gpu-int-tests.log | head -12 | cut -c1-250
timeout 170 python3 scripts/bench_int4.py --out $OUT/int4-gemm.json > $LOGS/int4.log 2>&1
at "bench_int4 rc=$?"; tail -3 $LOGS/int4.log | cut -c1-600
timeout $(( 380 - ($(date +%s) - S) )) python3 scripts/bench_int8.py --out $OUT/int8-gemm.json > $LOGS/int8.log 2>&1
at "bench_int8 rc=$?"; tail -3 $LOGS/int8.log | cut -c1-600
cp $LOGS/*.log $OUT/
