#!/usr/bin/env bash
# Session 29, H100 calls A/B (carry .whl): fp8-cache decode attention variants, layouts and configs against
# bf16 (scripts/bench_fp8_attention.py), then the Triton kernel tests on the GPU (attention, fp8 KV, fp8 GEMM).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 330 python3 scripts/bench_fp8_attention.py --out $OUT/fp8-attention.json --budget-s 270 > $OUT/fp8-attention.log 2>&1
echo "bench rc=$? at $(( $(date +%s) - S )) s"
python3 - <<PY
import json
d = json.load(open("$OUT/fp8-attention.json"))
for m in d["models"].values():
    print(m["rel_error_vs_float64"])
    for k, v in m["best"].items(): print(k, v)
PY
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_fp8_kv.py tests/test_triton_fp8_gemm.py tests/test_triton_attention.py > $OUT/gpu-tests.log 2>&1; tail -3 $OUT/gpu-tests.log
echo "total $(( $(date +%s) - S )) s"
