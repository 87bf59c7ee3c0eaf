#!/usr/bin/env bash
# Session 30, call C (carry .vllm/bundle.part03): batch-1 TPOT with and without speculation on the Llama-3.1-8B bf16
# artifact (n-gram K=3; the artifact as its own draft K=3: every draft accepted), verify steps in CUDA graphs.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 400 python3 scripts/gpu/spec_tpot.py --artifact /tmp/art/llama-bf16 --vocab 128256 --k 3 --modes baseline,ngram,draft_self \
  --out $OUT/spec-tpot-llama-bf16.json > $OUT/spec-tpot.log 2>&1
echo "spec rc=$? at $(( $(date +%s) - S )) s"; grep -E "tpot_s|accept|verify|rror" $OUT/spec-tpot.log | head -30
