#!/usr/bin/env bash
# Session 30, call J (fresh H100; carry .whl .gpu): Qwen3-0.6B bf16 (random weights drawn at build), then batch-1 TPOT
# without speculation, with n-gram K=3 (a step with no n-gram match now runs as a plain decode step) and with the
# artifact as its own draft K=3 (every draft accepted; the target's KV pool now leaves room for the draft's).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q=/tmp/m/qwen3-0.6b; mkdir -p $Q /tmp/art && cp .gpu/tokenizers/qwen3/* $Q/ && cp .gpu/configs/qwen3-0.6b.json $Q/config.json
S=$(date +%s)
timeout 420 python3 -m atom_aot.build.cli --model $Q --load-format dummy --max-model-len 4096 --out /tmp/art/qwen3-0.6b > $OUT/build-qwen.log 2>&1
echo "build rc=$? at $(( $(date +%s) - S )) s"; tr '\r' '\n' < $OUT/build-qwen.log | grep -E "stages|rror" | tail -2
timeout $(( 585 - ($(date +%s) - S) )) python3 scripts/gpu/spec_tpot.py --artifact /tmp/art/qwen3-0.6b --vocab 151936 --k 3 \
  --modes baseline,ngram,draft_self --out $OUT/spec-tpot-qwen3-0.6b.json > $OUT/spec-tpot.log 2>&1
echo "spec rc=$? at $(( $(date +%s) - S )) s"; grep -E "\"tpot_s|acceptance_rate|mean_accepted|rror" $OUT/spec-tpot.log | head -30
