#!/usr/bin/env bash
# Session 42, calls B-E (reused by s43_next_*: LOGS=/tmp/s43) (each carries one of .vllm/bundle.part00..03): stage that part of vLLM while the builds of
# call A compile on GPUs 0 and 1; with ARN=1 (call B) also the fused all-reduce + norm over 2 ranks on GPUs 2,3 in
# both modes (one-shot rows now summed in pairs, peer memory one allocation since session 41): checks, per-call
# timings and rank 0's join in parts.
LOGS=${LOGS:-/tmp/s42}; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ 2>/dev/null
export NCCL_NVLS_ENABLE=0
if [ "${ARN:-0}" = 1 ]; then
  for mode in fused fused-two-shot; do
    CUDA_VISIBLE_DEVICES=2,3 ATOM_ALL_REDUCE_NORM=$mode timeout 100 python3 scripts/gpu/all_reduce_norm_gpus.py --world 2 \
      --out $OUT/arn-tp2-$mode.json > $LOGS/arn-2-$mode.log 2>&1
    at "kernel tp2 $mode rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp2-$mode.json 2>&1 | tail -9 | cut -c1-250
    python3 -c "import json; print('join_s', json.load(open('$OUT/arn-tp2-$mode.json')).get('join_s'))"
  done
fi
for f in /tmp/build-*.pid; do f=$(basename $f .pid); f=${f#build-}; echo "$f: $(tr '\r' '\n' < $LOGS/build-$f.log | grep -v '^\s*$' | tail -1 | cut -c1-200)"; done
ls /tmp/vstage | tr '\n' ' '; uptime
