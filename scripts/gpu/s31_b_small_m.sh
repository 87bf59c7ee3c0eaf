#!/usr/bin/env bash
# Session 31, call B (carry .whl): the small-M FP8 kernel's tests on the GPU, then FP8 GEMMs at decode sizes
# as a decode step runs them (scripts/bench_fp8_decode_gemm.py) over a spread of configs.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -x tests/test_triton_fp8_small_m.py > $OUT/test-small-m-gpu.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/test-small-m-gpu.log
C="64,256,1,4,4;64,256,2,4,4;64,256,4,4,4;64,512,2,4,3;128,128,1,4,4;128,128,2,4,4;128,256,1,8,3;128,256,2,8,3;32,256,2,4,4;32,256,4,4,4;32,512,1,4,4;64,128,4,4,6;64,256,1,4,6;64,256,8,4,4;128,256,4,8,3;16,512,1,4,4"
timeout 440 python3 scripts/bench_fp8_decode_gemm.py --out $OUT/fp8-decode-gemm.json --configs "$C" --budget-s 380 2>&1 | tail -25
