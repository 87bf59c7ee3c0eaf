#!/usr/bin/env bash
# Session 35, nvidia-h100-x4 call B (carry .vllm/bundle.part01): stage vLLM part 1. Our Llama-3.1-8B -tp 2 artifact
# (GPUs 0,1) through the shared harness: cold start, throughput 256 x 1024/512, batch-1 TPOT, with the all-reduce
# bounds call A's 2-GPU table supports (/tmp/s35/plan-${TP}gpu.env; the code's defaults where it has none); then the
# same TPOT and throughput with every all-reduce on NCCL (ATOM_ALL_REDUCE=nccl), the A/B of the peer-memory path.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
TP=${TP:-2}; GPUS=$(seq -s, 0 $(( TP - 1 )))      # TP=4 for the -tp 4 artifact on GPUs 0-3 (a later session)
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=$GPUS
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
PLAN=$(grep -o "ATOM_ALL_REDUCE_ONE_SHOT_MAX=[0-9]* ATOM_ALL_REDUCE_TWO_SHOT_MAX=[0-9]*" /tmp/s35/plan-${TP}gpu.env 2>/dev/null)
echo "plan: ${PLAN:-code defaults}"; [ -n "$PLAN" ] && export $PLAN
R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp$TP"
timeout 330 $R --out $OUT/sbs-ours-llama-tp$TP.json --sections cold,throughput,tpot > $OUT/sbs-ours.log 2>&1
at "ours rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-ours.log | tail -8
grep -E "all-reduce|tensor-parallel ranks|decode steps|KV cache" $OUT/sbs-ours.log | sort | uniq -c | head -8
ATOM_ALL_REDUCE=nccl timeout $(( 560 - ($(date +%s) - S) )) $R --out $OUT/sbs-ours-llama-tp$TP-nccl.json --sections throughput,tpot > $OUT/sbs-ours-nccl.log 2>&1
at "ours nccl rc=$?"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-ours-nccl.log | tail -5; grep -E "all-reduce" $OUT/sbs-ours-nccl.log | sort | uniq -c
# where a start's seconds go (rank 0's breakdown) and how its ranks started (forked or new processes)
timeout 90 python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp$TP generate "Hello" --max-tokens 4 > $OUT/generate-startup.log 2>&1
at "generate rc=$?"; grep -E "tensor-parallel ranks|all-reduce|^startup|^path" $OUT/generate-startup.log | cut -c1-400
