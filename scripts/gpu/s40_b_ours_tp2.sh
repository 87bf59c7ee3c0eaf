#!/usr/bin/env bash
# Session 40, call B (carry .vllm/bundle.part00): stage vLLM part 0; our Llama-3.1-8B -tp 2 on GPUs 0,1: the fused
# kernel with 32 KiB slabs (256 rows on the peer path), throughput 256 x 1024/512 + batch-1 TPOT (default slabs),
# throughput with ATOM_ALL_REDUCE_NORM_SLAB=32768, three fresh-process starts (this session's load beside the
# join), `atom-run generate` start breakdowns with this session's runtime and the one before (/tmp/old; as run in
# session 40 both arms ran this session's code: `python -m` put the working directory first on sys.path).
LOGS=/tmp/s40; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1
R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp2"
timeout 150 $R --out $OUT/sbs-ours-tp2.json --sections throughput,tpot > $LOGS/sbs-tp2.log 2>&1
at "tp2 rc=$?"; grep -E "output_tok_s|tpot_s\"|rror" $LOGS/sbs-tp2.log | tail -3
ATOM_ALL_REDUCE_NORM_SLAB=32768 timeout 100 $R --out $OUT/sbs-ours-tp2-slab32k.json --sections throughput > $LOGS/sbs-tp2-32k.log 2>&1
at "tp2 slab 32k rc=$?"; grep -E "output_tok_s|rror" $LOGS/sbs-tp2-32k.log | tail -2; grep -E "all-reduce" $LOGS/sbs-tp2-32k.log | sort | uniq -c | head -1 | cut -c1-300
timeout 150 $R --out $OUT/sbs-ours-tp2-cold.json --sections cold > $LOGS/cold-tp2.log 2>&1
at "tp2 cold rc=$?"; grep -E "first_token_s|rror" $LOGS/cold-tp2.log | tail -3
G="python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp2 generate Hello --max-tokens 4"
for v in new old new old; do
  [ $v = old ] && D=/tmp/old || D=$PWD     # python -m puts the working directory first on sys.path
  (cd $D && PYTHONPATH=/tmp/site:$D timeout 60 $G) > $LOGS/generate-tp2-$v.log 2>&1; at "generate tp2 $v rc=$?"; grep -E "^startup" $LOGS/generate-tp2-$v.log | cut -c1-400
  cat $LOGS/generate-tp2-$v.log >> $OUT/generate-tp2-$v.log
done
ATOM_ALL_REDUCE_NORM_SLAB=32768 timeout 120 python3 scripts/gpu/all_reduce_norm_gpus.py --world 2 --out $OUT/arn-tp2-slab32k.json > $LOGS/arn2.log 2>&1
at "kernel tp2 slab 32k rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp2-slab32k.json 2>&1 | tail -8
ls /tmp/vstage | tr '\n' ' '
