#!/usr/bin/env bash
# Session 45, one H100, call G (carry .whl): a tiny float32 Llama with an fp8 KV cache built for the GPU, its
# compiled graphs (traced with the head-major cache's strides) against its eager module (tests/test_gpu.py).
LOGS=/tmp/s45; source scripts/gpu/prelude.sh
timeout 330 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu.py -k head_major > $OUT/gpu-fp8-pages.log 2>&1
at "tests rc=$?"; tail -15 $OUT/gpu-fp8-pages.log | cut -c1-300
