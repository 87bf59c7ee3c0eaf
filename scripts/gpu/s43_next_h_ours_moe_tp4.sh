#!/usr/bin/env bash
# Planned (call H, no carry): the 16-layer Qwen3-30B-A3B over four GPUs, -tp 4 and -tp 4 --ep (call A's builds):
# three fresh-process starts, throughput 256 x 1024/512 and TPOT for each, through the shared harness.
LOGS=/tmp/s43; source scripts/gpu/prelude.sh
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1,2,3
for name in moe16-tp4 moe16-ep4; do
  [ -d /tmp/art/$name ] || { echo "no /tmp/art/$name"; tr '\r' '\n' < $LOGS/build-$name.log | tail -3; continue; }
  timeout 250 python3 /tmp/sbs.py ours --model /tmp/m/qwen3-30b-a3b-16l --artifact /tmp/art/$name --out $OUT/sbs-ours-$name.json \
    --sections cold,throughput,tpot > $LOGS/sbs-$name.log 2>&1
  at "$name rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|rror" $LOGS/sbs-$name.log | tail -6
done
