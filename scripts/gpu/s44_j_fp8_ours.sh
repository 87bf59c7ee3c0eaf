#!/usr/bin/env bash
# Session 44, FP8 call J (after A with ART=llama-fp8 BUILD_FLAGS="--quant fp8 --kv-cache-dtype fp8" and F): ours, FP8
# W8A8 + FP8 KV, through the shared harness with this session's KV sizing: 256 x 1024/512 with batch-1 TPOT, then
# 1000 x 1000/1000 in one call (issue 19's max-load workload, TensorRT-LLM's published 15,270 tok/s).
LOGS=/tmp/s44; source scripts/gpu/prelude.sh
M=/tmp/m/llama-3.1-8b A=/tmp/art/llama-fp8
while pgrep -f "build.cli --model $M " > /dev/null && [ $(( $(date +%s) - S )) -lt ${WAIT:-200} ]; do sleep 5; done
at "build done"; cp $LOGS/build-llama-3.1-8b.log $OUT/build-llama-fp8.log; [ -d $A ] || exit 3
tr '\r' '\n' < $LOGS/build-llama-3.1-8b.log | grep -E "^stages|graph probe" | cut -c1-300
timeout 150 python3 /tmp/sbs.py ours --model $M --artifact $A --out $OUT/sbs-ours-llama-fp8.json --sections throughput,tpot \
  > $LOGS/sbs-ours-fp8.log 2>&1; at "ours fp8 rc=$?"; grep -E "output_tok_s|tpot_s\"|KV cache:|KV budget" $LOGS/sbs-ours-fp8.log | cut -c1-250
timeout $(( 590 - ($(date +%s) - S) )) python3 /tmp/sbs.py ours --model $M --artifact $A --out $OUT/sbs-ours-llama-fp8-1000x1000.json \
  --sections throughput --num-prompts 1000 --input-len 1000 --output-len 1000 > $LOGS/sbs-ours-fp8-1000.log 2>&1
at "ours fp8 1000x1000 rc=$?"; grep -E "output_tok_s|rror" $LOGS/sbs-ours-fp8-1000.log | tail -3
