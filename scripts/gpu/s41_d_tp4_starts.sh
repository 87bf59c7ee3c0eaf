#!/usr/bin/env bash
# Session 41, call D (carry .vllm/bundle.part02): stage vLLM part 2; Llama-3.1-8B -tp 4 starts on GPUs 0-3: three
# fresh processes to the first token through the shared harness, then two `atom-run generate` start breakdowns
# (each rank's join itemized, stamped to the millisecond). Run in session 41 on a second machine that had no
# artifacts yet (the first was released idle): nothing measured. Fixed after for the next session: the harness gets
# 200 s (three -tp 4 starts did not fit 100 s in call H), and the arm printing Python stacks is gone (faulthandler's
# dumps crashed the process during `import torch`, call G); and the fused kernel at 4 ranks (rows in pairs since
# session 41, one-allocation peer memory) against the planned all-reduce then norm, in the same run.
LOGS=/tmp/s41; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1,2,3
timeout 200 python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp4 --out $OUT/sbs-ours-tp4-cold.json \
  --sections cold > $LOGS/cold-tp4.log 2>&1
at "tp4 cold rc=$?"; grep -E "first_token_s|rror" $LOGS/cold-tp4.log | tail -3
for i in 1 2; do
  timeout 60 python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp4 generate Hello --max-tokens 4 > $LOGS/generate-tp4-$i.log 2>&1
  at "generate tp4 $i rc=$?"; grep -E "^startup|rank [0-9].*(joined|met|on cuda)" $LOGS/generate-tp4-$i.log | cut -c1-330; cp $LOGS/generate-tp4-$i.log $OUT/
done
timeout 120 python3 scripts/gpu/all_reduce_norm_gpus.py --world 4 --out $OUT/arn-tp4.json > $LOGS/arn4.log 2>&1
at "kernel tp4 rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp4.json 2>&1 | grep -E "BITS|replays|timing" | tail -7 | cut -c1-250
ls /tmp/vstage | tr '\n' ' '
