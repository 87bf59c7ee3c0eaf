#!/usr/bin/env bash
# Planned (call F; carry .vllm/bundle.part04, staged for the next call's vLLM install): Llama-3.1-8B -tp 4 on GPUs 0-3
# once call A's builds are done: two `atom-run generate` starts (the join allocates peer memory beside the process
# group since session 42: the rank logs' `allocated (beside the process group)` and `waited for the allocation`),
# three fresh processes to the first token through the harness, then throughput 256 x 1024/512 with our default
# 8192 batched tokens per step and with vLLM's offline default 16384 (its log: compile range (1, 16384)), and TPOT;
# first the fused kernel's checks over 4 ranks on peer memory allocated beside the process group.
LOGS=/tmp/s43; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ 2>/dev/null
running() { for f in /tmp/build-*.pid; do kill -0 "$(cat $f)" 2>/dev/null && return 0; done; return 1; }
while running && [ $(( $(date +%s) - S )) -lt 400 ]; do sleep 3; done
at "builds waited"; for f in $LOGS/build-*.log; do echo "$f $(tr '\r' '\n' < $f | grep -E '^stages|rror' | tail -1 | cut -c1-300)"; done
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1,2,3
for i in 1 2; do
  timeout 60 python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp4 generate Hello --max-tokens 4 > $LOGS/generate-tp4-$i.log 2>&1
  at "generate tp4 $i rc=$?"; grep -E "^startup|rank [0-9] joined" $LOGS/generate-tp4-$i.log | cut -c1-500; cp $LOGS/generate-tp4-$i.log $OUT/
done
timeout 80 python3 scripts/gpu/all_reduce_norm_gpus.py --world 4 --out $OUT/arn-tp4.json > $LOGS/arn4.log 2>&1   # checks on the new join
at "kernel tp4 rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp4.json 2>&1 | grep -E "BITS|replays" | tail -4 | cut -c1-250
python3 -c "import json; print('join_s', json.load(open('$OUT/arn-tp4.json')).get('join_s'))"
R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp4"
timeout 150 $R --out $OUT/sbs-ours-tp4-cold.json --sections cold > $LOGS/cold-tp4.log 2>&1
at "tp4 cold rc=$?"; grep -E "first_token_s|rror" $LOGS/cold-tp4.log | tail -3
timeout 100 $R --out $OUT/sbs-ours-tp4-16k.json --sections throughput --engine-kwargs '{"max_num_batched_tokens": 16384}' > $LOGS/sbs-tp4-16k.log 2>&1
at "tp4 16384 rc=$?"; grep -E "output_tok_s|rror" $LOGS/sbs-tp4-16k.log | tail -2
timeout 130 $R --out $OUT/sbs-ours-tp4.json --sections throughput,tpot > $LOGS/sbs-tp4.log 2>&1
at "tp4 default rc=$?"; grep -E "output_tok_s|tpot_s\"|rror" $LOGS/sbs-tp4.log | tail -3
