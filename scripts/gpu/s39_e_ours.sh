#!/usr/bin/env bash
# Session 39, call E (carry .vllm/bundle.part00): stage vLLM part 0; on this machine (vLLM follows in call H) our
# Llama-3.1-8B -tp 2 (GPUs 0,1) and -tp 4 (GPUs 0-3): throughput 256 x 1024/512 and batch-1 TPOT through the shared
# harness, -tp 4's TPOT again with ATOM_ALL_REDUCE_NORM=separate, and each start's breakdown (`atom-run generate`).
LOGS=/tmp/s39; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export NCCL_NVLS_ENABLE=0
R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b"
for tp in 2 4; do
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( tp - 1 ))) timeout 200 $R --artifact /tmp/art/llama-tp$tp --out $OUT/sbs-ours-e-llama-tp$tp.json --sections throughput,tpot > $LOGS/sbs-e-tp$tp.log 2>&1
  at "ours tp$tp rc=$?"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $LOGS/sbs-e-tp$tp.log | tail -4; grep -E "all-reduce" $LOGS/sbs-e-tp$tp.log | sort | uniq -c | head -1 | cut -c1-300
done
CUDA_VISIBLE_DEVICES=0,1,2,3 ATOM_ALL_REDUCE_NORM=separate timeout 100 $R --artifact /tmp/art/llama-tp4 --out $OUT/sbs-ours-e-llama-tp4-separate.json --sections tpot > $LOGS/sbs-e-tp4-sep.log 2>&1
at "ours tp4 separate rc=$?"; grep -E "tpot_s\"|rror" $LOGS/sbs-e-tp4-sep.log | tail -2
for tp in 2 4; do
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( tp - 1 ))) timeout 60 python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp$tp generate "Hello" --max-tokens 4 > $LOGS/generate-tp$tp.log 2>&1
  at "generate tp$tp rc=$?"; grep -E "tensor-parallel ranks|^startup|runtime compilations" $LOGS/generate-tp$tp.log | cut -c1-300
done
cp $LOGS/generate-tp*.log $OUT/; ls /tmp/vstage | tr '\n' ' '
