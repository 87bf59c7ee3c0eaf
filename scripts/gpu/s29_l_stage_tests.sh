#!/usr/bin/env bash
# Session 29, calls L-N (carry one of .vllm/bundle.part02..04): stage it; the Triton kernel tests on the GPU
# (fp8 KV and fp8 GEMM tests now make their tensors on the GPU) in the first.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ && ls /tmp/vstage | wc -l
if [ ! -f /tmp/tests-done ]; then
  touch /tmp/tests-done
  PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_fp8_kv.py tests/test_triton_fp8_gemm.py tests/test_triton_attention.py > $OUT/gpu-tests.log 2>&1; tail -3 $OUT/gpu-tests.log
fi
