#!/usr/bin/env bash
# Issue 15, GPU calls D and E (carry .vllm/bundle.part03, then part04): stage only, plus the KV bandwidth sweep in D.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ && ls /tmp/vstage
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ "${1:-}" = "kernels" ]; then
  timeout 300 python3 scripts/bench_kernels.py --out $OUT/kernels.json --budget-s 200 2>&1 | tail -30
fi
