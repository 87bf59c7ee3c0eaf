#!/usr/bin/env bash
# Planned for the next multi-GPU session (nvidia-h200-x4, after s40_a_builds.sh on the same machine; vLLM beside it
# with s40_f_vllm.sh): the fused all-reduce + norm's two-shot mode (ATOM_ALL_REDUCE_NORM=fused-two-shot, built in
# session 40, CPU-tested only) against its one-shot default: the kernel's checks and per-call timings on 2 and 4
# GPUs, then Llama-3.1-8B throughput 256 x 1024/512 and batch-1 TPOT at -tp 2 and -tp 4 with each mode.
LOGS=/tmp/s41; source scripts/gpu/prelude.sh
export NCCL_NVLS_ENABLE=0
for W in 2 4; do
  for mode in fused fused-two-shot; do
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( W - 1 ))) ATOM_ALL_REDUCE_NORM=$mode timeout 150 python3 scripts/gpu/all_reduce_norm_gpus.py \
      --world $W --out $OUT/arn-tp$W-$mode.json > $LOGS/arn-$W-$mode.log 2>&1
    at "kernel tp$W $mode rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp$W-$mode.json 2>&1 | grep -E "timing|BITS|replays" | cut -c1-250
  done
done
for W in 2 4; do
  R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp$W"
  for mode in fused-two-shot fused; do
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( W - 1 ))) ATOM_ALL_REDUCE_NORM=$mode timeout 150 $R --out $OUT/sbs-ours-tp$W-$mode.json \
      --sections throughput,tpot > $LOGS/sbs-$W-$mode.log 2>&1
    at "tp$W $mode rc=$?"; grep -E "output_tok_s|tpot_s\"|rror" $LOGS/sbs-$W-$mode.log | tail -3
  done
done
