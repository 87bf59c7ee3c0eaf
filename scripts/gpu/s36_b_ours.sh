#!/usr/bin/env bash
# Session 36, multi-GPU call B (carry .vllm/bundle.part00): stage vLLM part 0. Through the shared harness on GPUs 0,1:
# our Llama-3.1-8B -tp 2 (cold start x3, throughput 256 x 1024/512, batch-1 TPOT) with the all-reduce bounds the
# code ships; a start's breakdown and how its ranks started (`atom-run generate`); then the 16-layer Qwen3-30B-A3B
# -tp 2 (cold, throughput, TPOT) and -tp 2 --ep (throughput, TPOT). A MoE build that call A's time cut short is
# resumed first (build/resume.py).
mkdir -p /tmp/vstage /tmp/s36 && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0,1
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
for f in tp2 ep2; do
  [ -d /tmp/art/moe-$f ] && continue
  EP=; [ $f = ep2 ] && EP=--ep
  CUDA_VISIBLE_DEVICES=$([ $f = tp2 ] && echo 2 || echo 3) timeout 300 python3 -m atom_aot.build.cli --max-model-len 4096 --cache-dir /tmp/atom-cache \
    --model /tmp/m/qwen3-30b-a3b-16l --load-format dummy-at-load -tp 2 $EP --out /tmp/art/moe-$f > /tmp/s36/build-moe-$f-resumed.log 2>&1 &
done; wait; at "moe builds present: $(ls /tmp/art | tr '\n' ' ')"
R="python3 /tmp/sbs.py ours"
timeout 300 $R --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp2 --out $OUT/sbs-ours-llama-tp2.json --sections cold,throughput,tpot > /tmp/s36/sbs-ours-llama.log 2>&1
at "ours llama rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" /tmp/s36/sbs-ours-llama.log | tail -8
grep -E "all-reduce|tensor-parallel ranks|decode steps|KV cache" /tmp/s36/sbs-ours-llama.log | sort | uniq -c | head -8 | cut -c1-300
timeout 90 python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp2 generate "Hello" --max-tokens 4 > /tmp/s36/generate-startup.log 2>&1
at "generate rc=$?"; grep -E "tensor-parallel ranks|all-reduce|^startup|^path" /tmp/s36/generate-startup.log | cut -c1-400
M=/tmp/m/qwen3-30b-a3b-16l
timeout $(( 500 - ($(date +%s) - S) )) $R --model $M --artifact /tmp/art/moe-tp2 --out $OUT/sbs-ours-moe-tp2.json --sections cold,throughput,tpot > /tmp/s36/sbs-ours-moe-tp2.log 2>&1
at "ours moe tp2 rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" /tmp/s36/sbs-ours-moe-tp2.log | tail -8
timeout $(( 585 - ($(date +%s) - S) )) $R --model $M --artifact /tmp/art/moe-ep2 --out $OUT/sbs-ours-moe-ep2.json --sections throughput,tpot > /tmp/s36/sbs-ours-moe-ep2.log 2>&1
at "ours moe ep2 rc=$?"; grep -E "output_tok_s|tpot_s\"|init_s|rror" /tmp/s36/sbs-ours-moe-ep2.log | tail -5
grep -h -E "all-reduce|expert|all-to-all|weights drawn" /tmp/s36/sbs-ours-moe-*.log | sort | uniq -c | head -8 | cut -c1-300
cp /tmp/s36/generate-startup.log /tmp/s36/sbs-ours-llama.log $OUT/ 2>/dev/null
