#!/usr/bin/env bash
# Session 45, one H100, call E (carry .whl): head-major pages (one kv head's slots contiguous in a page) on top of
# the page ids read ahead, fp8 and bf16, decode at batch 256 and 64 (scripts/bench_fp8_attention.py).
LOGS=/tmp/s45; source scripts/gpu/prelude.sh
timeout 200 python3 scripts/bench_fp8_attention.py --out $OUT/head-major.json --budget-s 150 --shapes 256x1024,256x2048,64x2048 \
  --variants "fp8->fp16 prefetch,fp8->fp16 head-major prefetch,bf16 prefetch,bf16 head-major prefetch" > $OUT/head-major.log 2>&1
at "bench rc=$?"
python3 - <<PY
import json
d = json.load(open("$OUT/head-major.json"))
for m in d["models"].values():
    print(m["rel_error_vs_float64"])
    for k, v in m["best"].items(): print(k, v)
PY
