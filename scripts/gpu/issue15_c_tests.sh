#!/usr/bin/env bash
# Issue 15, GPU call C (carry .vllm/bundle.part02): the GPU tests (greedy parity, async == sync, kernels, AOTI splits).
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 420 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_triton_attention.py tests/test_triton_export.py -x 2>&1 | tail -15
