#!/usr/bin/env bash
# Session 48, one H100, one call (carry .whl): the int4 GEMMs rewritten after s48_a_int.sh measured them (nibbles
# widened by bit patterns, zero points off after the dot; a small-M kernel with split K): their kernel tests on
# CUDA (float64 references), then scripts/bench_int4.py (check against the CPU reference, then time against bf16
# cuBLAS on Llama-3.1-8B's linear shapes).
LOGS=/tmp/s48; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_triton_int4_gemm.py tests/test_triton_int4_small_m.py \
  tests/test_triton_int8_small_m.py > $OUT/gpu-int4-tests.log 2>&1
at "kernel tests rc=$?"; grep -E "passed|failed|^FAILED|^E " $OUT/gpu-int4-tests.log | head -12 | cut -c1-250
timeout $(( 270 - ($(date +%s) - S) )) python3 scripts/bench_int4.py --out $OUT/int4-gemm.json > $LOGS/int4.log 2>&1
at "bench_int4 rc=$?"; tail -2 $LOGS/int4.log | cut -c1-300; cp $LOGS/int4.log $OUT/
