#!/usr/bin/env bash
# Session 31, call H (carry .whl): the fp8 kernels' tests on the GPU after the per-K-step fp32 promotion in fp8_gemm
# and the package test through build/export.compile_package; then fp8_gemm's configs against cuBLASLt at decode
# 256 and prefill 2048 on the two largest Llama-3.1-8B shapes (the promotion's cost, if any).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_triton_fp8_small_m.py tests/test_triton_fp8_gemm.py > $OUT/test-fp8-gpu.log 2>&1
echo "tests rc=$?"; grep -E "FAILED|passed|failed|assert " $OUT/test-fp8-gpu.log | tail -12
timeout 200 python3 scripts/bench_fp8.py --out $OUT/fp8-gemm-after-promotion.json --tokens 256,2048 --groups gate_up_proj,down_proj --budget-s 150 > $OUT/bench.log 2>&1
echo "bench rc=$?"; python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/fp8-gemm-after-promotion.json"))
for r in d["rows"]:
    t = {k[:-3]: round(v * 1000, 1) for k, v in r.items() if k.endswith(" ms") and k.startswith("fp8 channel")}
    print(r["group"], r["m"], "bf16", round(r["bf16_ms"] * 1000, 1), t)
PY
