#!/usr/bin/env bash
# Session 41, call H (right after G, same machine): three fresh-process starts to the first token through the
# shared harness with each ATOM_RANK_LOAD; where a -tp 4 batch-256 decode step goes (rank 0's kernels); the fused
# kernel's two-shot mode against one-shot at 2 ranks.
LOGS=/tmp/s41; source scripts/gpu/prelude.sh
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1,2,3
for v in beside; do
  ATOM_RANK_LOAD=$v timeout 100 python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp4 \
    --out $OUT/sbs-ours-tp4-cold-$v.json --sections cold > $LOGS/cold-$v.log 2>&1
  at "cold $v rc=$?"; grep -E "first_token_s|rror" $LOGS/cold-$v.log | tail -3 | tr '\n' ' '; echo
done
timeout 100 python3 scripts/profile_decode.py --artifact /tmp/art/llama-tp4 --batch 256 --input-len 1024 \
  --sections step,kernels --out $OUT/profile-tp4-b256.json > $LOGS/profile-tp4.log 2>&1
at "profile rc=$?"; python3 -c "
import json; d = json.load(open('$OUT/profile-tp4-b256.json')); k = d.get('kernels', {})
print(k.get('category_ms_per_step'), k.get('gpu_kernel_ms_per_step')); print([(t['name'][:50], round(t['ms_per_step'], 3), t['calls_per_step']) for t in k.get('top_kernels', [])[:10]]); print(d.get('step'))" 2>&1 | cut -c1-2500
export CUDA_VISIBLE_DEVICES=0,1
for mode in fused-two-shot fused; do
  ATOM_ALL_REDUCE_NORM=$mode timeout 80 python3 scripts/gpu/all_reduce_norm_gpus.py --world 2 --out $OUT/arn-tp2-$mode.json > $LOGS/arn-2-$mode.log 2>&1
  at "kernel tp2 $mode rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp2-$mode.json 2>&1 | grep timing | tail -3 | cut -c1-250
done
