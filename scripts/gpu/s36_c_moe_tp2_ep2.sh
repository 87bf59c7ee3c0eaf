#!/usr/bin/env bash
# Planned for a later multi-GPU session (carry .whl .gpu/configs .gpu/tokenizers/qwen3 .vllm/sbs.py; vLLM staged
# and installed by earlier calls): Qwen3-30B-A3B (all 48 layers, random bf16 weights drawn at load, nothing stored)
# built -tp 2 (GPU 0) and -tp 2 --ep (GPU 1) side by side, then each through the shared harness on GPUs 0,1
# (throughput 256 x 1024/512, batch-1 TPOT). vLLM's pair: MODEL=qwen3-30b-a3b TP=2 [EXTRA=', "enable_expert_parallel":
# true'] bash scripts/gpu/s35_f_vllm_tp2.sh.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
M=/tmp/m/qwen3-30b-a3b; mkdir -p $M /tmp/art /tmp/s36 && cp .gpu/configs/qwen3-30b-a3b.json $M/config.json && cp .gpu/tokenizers/qwen3/* $M/
B="python3 -m atom_aot.build.cli --model $M --max-model-len 4096 --load-format dummy-at-load --cache-dir /tmp/atom-cache"
CUDA_VISIBLE_DEVICES=0 timeout 420 $B -tp 2 --out /tmp/art/qwen3-moe-tp2 > /tmp/s36/build-moe-tp2.log 2>&1 &
P1=$!
CUDA_VISIBLE_DEVICES=1 timeout 420 $B -tp 2 --ep --out /tmp/art/qwen3-moe-ep2 > /tmp/s36/build-moe-ep2.log 2>&1 &
P2=$!
wait $P1; at "tp2 build rc=$?"; wait $P2; at "ep2 build rc=$?"
for f in tp2 ep2; do echo "$f $(tr '\r' '\n' < /tmp/s36/build-moe-$f.log | grep -E '^stages|rror' | tail -1)"; done | tee $OUT/moe-build-stages.txt | cut -c1-300
for f in tp2 ep2; do
  CUDA_VISIBLE_DEVICES=0,1 timeout $(( 585 - ($(date +%s) - S) )) python3 /tmp/sbs.py ours --model $M --artifact /tmp/art/qwen3-moe-$f \
    --out $OUT/sbs-ours-qwen3-moe-$f.json --sections throughput,tpot > /tmp/s36/sbs-moe-$f.log 2>&1
  at "ours $f rc=$?"; grep -E "output_tok_s|tpot_s\"|rror" /tmp/s36/sbs-moe-$f.log | tail -3
done
