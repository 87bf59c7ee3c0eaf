#!/usr/bin/env bash
# Session 41, call C (carry .vllm/bundle.part01): stage vLLM part 1; Llama-3.1-8B -tp 4 on GPUs 0-3: the fused
# all-reduce + norm kernel's two-shot mode (ATOM_ALL_REDUCE_NORM=fused-two-shot, session 40, CPU-tested) against its
# one-shot default: the kernel's checks and per-call timings at 4 ranks, then throughput 256 x 1024/512 with each
# mode on the same artifact (the default's run also batch-1 TPOT: the two-shot mode only changes >= 193-row messages).
LOGS=/tmp/s41; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1,2,3
for mode in fused-two-shot fused; do
  ATOM_ALL_REDUCE_NORM=$mode timeout 120 python3 scripts/gpu/all_reduce_norm_gpus.py --world 4 --out $OUT/arn-tp4-$mode.json > $LOGS/arn-4-$mode.log 2>&1
  at "kernel tp4 $mode rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp4-$mode.json 2>&1 | tail -9 | cut -c1-250
done
R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp4"
ATOM_ALL_REDUCE_NORM=fused-two-shot timeout 110 $R --out $OUT/sbs-ours-tp4-two-shot.json --sections throughput > $LOGS/sbs-tp4-two-shot.log 2>&1
at "tp4 two-shot rc=$?"; grep -E "output_tok_s|rror" $LOGS/sbs-tp4-two-shot.log | tail -2; grep -E "all-reduce over" $LOGS/sbs-tp4-two-shot.log | sort | uniq -c | head -1 | cut -c1-300
timeout 150 $R --out $OUT/sbs-ours-tp4.json --sections throughput,tpot > $LOGS/sbs-tp4.log 2>&1
at "tp4 default rc=$?"; grep -E "output_tok_s|tpot_s\"|rror" $LOGS/sbs-tp4.log | tail -3
ls /tmp/vstage | tr '\n' ' '
