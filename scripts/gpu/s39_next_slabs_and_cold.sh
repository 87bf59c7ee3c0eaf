#!/usr/bin/env bash
# Planned for the next multi-GPU session (after s39_d_rebuild.sh on the same machine; vLLM's numbers from
# s39_f_vllm.sh on it too): where batch-256 throughput goes with more rows on the fused kernel's peer path
# (ATOM_ALL_REDUCE_NORM_SLAB: 16 KiB is the default and took up to 128 rows of 4096; 32 KiB takes 256 rows, 64 KiB
# 512), at -tp 2 and -tp 4, and our -tp 4 cold start with time for three starts (session 39's 90 s was too short).
LOGS=/tmp/s40; source scripts/gpu/prelude.sh
export NCCL_NVLS_ENABLE=0
R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b"
for slab in 32768 65536; do
  for tp in 2 4; do
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( tp - 1 ))) ATOM_ALL_REDUCE_NORM_SLAB=$slab timeout 120 $R --artifact /tmp/art/llama-tp$tp \
      --out $OUT/sbs-ours-llama-tp$tp-slab$slab.json --sections throughput > $LOGS/slab-$tp-$slab.log 2>&1
    at "tp$tp slab $slab rc=$?"; grep -E "output_tok_s|rror" $LOGS/slab-$tp-$slab.log | tail -2
  done
done
CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 200 $R --artifact /tmp/art/llama-tp4 --out $OUT/sbs-ours-llama-tp4-cold.json --sections cold > $LOGS/cold-tp4.log 2>&1
at "tp4 cold rc=$?"; grep -E "first_token_s|rror" $LOGS/cold-tp4.log | tail -3
