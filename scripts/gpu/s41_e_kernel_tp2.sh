#!/usr/bin/env bash
# Session 41, call E (carry .vllm/bundle.part03): stage vLLM part 3; the fused all-reduce + norm's two-shot mode
# against one-shot at 2 ranks (GPUs 0,1): checks and per-call timings.
LOGS=/tmp/s41; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1
for mode in fused-two-shot fused; do
  ATOM_ALL_REDUCE_NORM=$mode timeout 100 python3 scripts/gpu/all_reduce_norm_gpus.py --world 2 --out $OUT/arn-tp2-$mode.json > $LOGS/arn-2-$mode.log 2>&1
  at "kernel tp2 $mode rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp2-$mode.json 2>&1 | tail -9 | cut -c1-250
done
ls /tmp/vstage | tr '\n' ' '
