#!/usr/bin/env bash
# Session 38, call B (same machine as A, or a fresh one: carry .whl .gpu/configs .gpu/tokenizers): which verify
# route a dense model should take. Qwen3-0.6B (random weights drawn at load), batch-1 TPOT with n-gram (K=3)
# and draft=self (K=3: every draft accepted) through the mixed package's verify graphs (the default for
# non-MLA models) and through decode rows (ATOM_VERIFY_ROUTE=decode-rows), beside the baseline.
LOGS=/tmp/s38; source scripts/gpu/prelude.sh
Q=/tmp/m/qwen3-0.6b; ART=/tmp/art/qwen3-0.6b
mkdir -p $Q && cp .gpu/tokenizers/qwen3/* $Q/ && cp .gpu/configs/qwen3-0.6b.json $Q/config.json
[ -d $ART ] || timeout 300 python3 -m atom_aot.build.cli --model $Q --load-format dummy-at-load --max-model-len 4096 \
  --cache-dir /tmp/atom-cache --out $ART > $LOGS/build-qwen.log 2>&1
at "build rc=$?"; tr '\r' '\n' < $LOGS/build-qwen.log | grep -E '^stages|rror' | tail -2 | cut -c1-400
T="python3 scripts/gpu/spec_tpot.py --artifact $ART --vocab 151936 --k 3"
timeout 200 $T --modes baseline,ngram,draft_self --out $OUT/qwen-mixed.json > $LOGS/qwen-mixed.log 2>&1
at "mixed route rc=$?"
ATOM_VERIFY_ROUTE=decode-rows timeout 200 $T --modes ngram,draft_self --out $OUT/qwen-decode-rows.json \
  > $LOGS/qwen-rows.log 2>&1
at "decode rows rc=$?"
python3 scripts/gpu/tpot_summary.py $OUT/qwen-*.json
grep -h "verify steps" $LOGS/qwen-*.log | sort | uniq -c | cut -c1-300
