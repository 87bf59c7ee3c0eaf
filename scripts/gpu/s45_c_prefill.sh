#!/usr/bin/env bash
# Session 45, one H100, call C (carry .whl): prefill steps with and without the prefetched page ids (the kernel's
# unmasked loop runs in prefill tiles too), then decode at batch 256 and 1 with the build's candidates (now with
# the prefetch's configs), then the Triton attention tests compiled on the GPU.
LOGS=/tmp/s45; source scripts/gpu/prelude.sh
timeout 260 python3 scripts/bench_fp8_attention.py --out $OUT/prefill-prefetch.json --budget-s 200 --prefill \
  --shapes 256x1024,1x4096 > $OUT/prefill-prefetch.log 2>&1
at "bench rc=$?"
python3 - <<PY
import json
d = json.load(open("$OUT/prefill-prefetch.json"))
for m in d["models"].values():
    print(m["rel_error_vs_float64"])
    for k, v in {**m["prefill_best"], **m["best"]}.items(): print(k, v["ms"], v["config"])
PY
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_attention.py tests/test_triton_fp8_kv.py > $OUT/gpu-tests.log 2>&1
at "tests rc=$?"; tail -3 $OUT/gpu-tests.log
