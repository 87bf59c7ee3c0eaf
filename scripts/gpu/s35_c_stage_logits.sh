#!/usr/bin/env bash
# Session 35, call C (carry .vllm/bundle.part02): stage vLLM part 2; bf16 logits of Llama-3.1-8B TP-2 vs TP-1
# (call A's artifacts of the same random weights), with its log's tail.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 200 python3 scripts/gpu/tp_two_gpus.py logits --tp1 /tmp/art/llama-tp1 --tp2 /tmp/art/llama-tp2 \
  --out $OUT/llama-logits-tp2-vs-tp1.json > $OUT/logits.log 2>&1
echo "logits rc=$? at $(( $(date +%s) - S )) s"; grep -vE "^\s*$" $OUT/logits.log | grep -E "INFO|rror|Trace|logits_tp2" | cut -c1-200 | tail -25
python3 -c "import json; d=json.load(open('$OUT/llama-logits-tp2-vs-tp1.json')); print(d.get('logits_tp2_vs_tp1', d.get('error')))" 2>&1 | cut -c1-1800
