#!/usr/bin/env bash
# Session 45, one H100, call F (carry .whl): head-major pages in prefill (with the page ids read ahead where a
# config has 3+ stages), fp8 and bf16, and decode at batch 256 once more (scripts/bench_fp8_attention.py).
LOGS=/tmp/s45; source scripts/gpu/prelude.sh
timeout 200 python3 scripts/bench_fp8_attention.py --out $OUT/head-major-prefill.json --budget-s 150 --prefill --shapes 256x1024 \
  --variants "fp8->fp16 prefetch,fp8->fp16 head-major prefetch,bf16 prefetch,bf16 head-major prefetch" > $OUT/hm-prefill.log 2>&1
at "bench rc=$?"
python3 - <<PY
import json
d = json.load(open("$OUT/head-major-prefill.json"))
for m in d["models"].values():
    for k, v in {**m["prefill_best"], **m["best"]}.items(): print(k, v["ms"], v["config"])
PY
