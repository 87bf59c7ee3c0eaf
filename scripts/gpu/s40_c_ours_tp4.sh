#!/usr/bin/env bash
# Session 40, call C (carry .vllm/bundle.part01): stage vLLM part 1; our Llama-3.1-8B -tp 4 on GPUs 0-3: as call B
# (throughput + TPOT, throughput with 32 KiB slabs, three fresh-process starts, generate breakdowns new / old: as
# run in session 40 both ran this session's code, see call B),
# then the fused kernel at 4 ranks with 32 KiB slabs.
LOGS=/tmp/s40; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1,2,3
R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp4"
timeout 150 $R --out $OUT/sbs-ours-tp4.json --sections throughput,tpot > $LOGS/sbs-tp4.log 2>&1
at "tp4 rc=$?"; grep -E "output_tok_s|tpot_s\"|rror" $LOGS/sbs-tp4.log | tail -3
ATOM_ALL_REDUCE_NORM_SLAB=32768 timeout 100 $R --out $OUT/sbs-ours-tp4-slab32k.json --sections throughput > $LOGS/sbs-tp4-32k.log 2>&1
at "tp4 slab 32k rc=$?"; grep -E "output_tok_s|rror" $LOGS/sbs-tp4-32k.log | tail -2
timeout 200 $R --out $OUT/sbs-ours-tp4-cold.json --sections cold > $LOGS/cold-tp4.log 2>&1
at "tp4 cold rc=$?"; grep -E "first_token_s|rror" $LOGS/cold-tp4.log | tail -3
G="python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp4 generate Hello --max-tokens 4"
for v in new old; do
  [ $v = old ] && D=/tmp/old || D=$PWD     # python -m puts the working directory first on sys.path
  (cd $D && PYTHONPATH=/tmp/site:$D timeout 60 $G) > $LOGS/generate-tp4-$v.log 2>&1; at "generate tp4 $v rc=$?"; grep -E "^startup" $LOGS/generate-tp4-$v.log | cut -c1-400
  cp $LOGS/generate-tp4-$v.log $OUT/
done
ATOM_ALL_REDUCE_NORM_SLAB=32768 timeout 120 python3 scripts/gpu/all_reduce_norm_gpus.py --world 4 --out $OUT/arn-tp4-slab32k.json > $LOGS/arn4.log 2>&1
at "kernel tp4 slab 32k rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp4-slab32k.json 2>&1 | tail -8
ls /tmp/vstage | tr '\n' ' '
