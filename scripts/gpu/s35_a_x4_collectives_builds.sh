#!/usr/bin/env bash
# Session 35, nvidia-h100-x4 call A (carry .whl .gpu/configs .gpu/tokenizers/llama3 .vllm/bundle.part00 .vllm/SHA256SUMS
# .vllm/install.sh .vllm/sbs.py): stage vLLM part 0. Llama-3.1-8B -tp 2 (GPU 0) and -tp 1 dummy-at-load (GPU 1) built
# side by side; meanwhile the all-reduce table on the idle GPUs 2,3 (NCCL vs peer memory), then the tiny fp32
# TP-2/TP-4 == TP-1 check on all four (correctness only, beside the builds); once all is done the 4-GPU all-reduce
# table and the bf16 logits TP-2 vs TP-1. Artifacts and tables stay in /tmp for the next calls.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage /tmp/s35 && cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader; nvidia-smi topo -m | head -6
env | grep -E "^(NCCL_|TORCH_SYMM|NVSHMEM)" | tr '\n' ' '; echo
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA /tmp/art && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
B="python3 -m atom_aot.build.cli --model $LLAMA --max-model-len 4096 --cache-dir /tmp/atom-cache"
CUDA_VISIBLE_DEVICES=0 timeout 430 $B --load-format dummy -tp 2 --out /tmp/art/llama-tp2 > $OUT/build-tp2.log 2>&1 &
P2=$!
CUDA_VISIBLE_DEVICES=1 timeout 430 $B --load-format dummy-at-load --out /tmp/art/llama-tp1 > $OUT/build-tp1.log 2>&1 &
P1=$!
CUDA_VISIBLE_DEVICES=2,3 timeout 110 python3 scripts/gpu/tp_two_gpus.py collectives --out $OUT/collectives-2gpu.json > $OUT/collectives-2gpu.log 2>&1
at "collectives 2 GPUs rc=$?"; cp $OUT/collectives-2gpu.json* /tmp/s35/ 2>/dev/null
python3 -c "
import json; d=json.load(open('$OUT/collectives-2gpu.json.rows.json'))
print({k: v for k, v in d.items() if k != 'rows'})
for r in d['rows']: print({k: r[k] for k in r if k in ('tokens','nccl_graph_us','atom_all_reduce_path','atom_all_reduce_graph_us','symm_one_shot_copy_graph_us','symm_two_shot_graph_us','symm_one_shot_max_err','symm_two_shot_max_err','symm_error')})" 2>&1 | cut -c1-330
python3 scripts/gpu/tp_two_gpus.py plan --table $OUT/collectives-2gpu.json.rows.json 2>&1 | tee /tmp/s35/plan-2gpu.env
timeout $(( 400 - ($(date +%s) - S) )) python3 scripts/gpu/tp_two_gpus.py tiny --out $OUT/tiny-tp.json > $OUT/tiny.log 2>&1
at "tiny rc=$?"; python3 -c "import json; d=json.load(open('$OUT/tiny-tp.json')); print(d.get('tiny_fp32_greedy'), d.get('error'))" 2>&1 | cut -c1-600
wait $P2; at "tp2 build rc=$?"
wait $P1; at "tp1 build rc=$?"
for f in tp2 tp1; do tr '\r' '\n' < $OUT/build-$f.log | grep -v "^\s*$" | awk '!s[$0]++' | grep -E "stages|Error|rror:" | tail -2 | cut -c1-400; done
timeout $(( 500 - ($(date +%s) - S) )) python3 scripts/gpu/tp_two_gpus.py collectives --out $OUT/collectives-4gpu.json > $OUT/collectives-4gpu.log 2>&1
at "collectives 4 GPUs rc=$?"; cp $OUT/collectives-4gpu.json* /tmp/s35/ 2>/dev/null
python3 scripts/gpu/tp_two_gpus.py plan --table $OUT/collectives-4gpu.json.rows.json 2>&1 | tee /tmp/s35/plan-4gpu.env
timeout $(( 585 - ($(date +%s) - S) )) python3 scripts/gpu/tp_two_gpus.py logits --tp1 /tmp/art/llama-tp1 --tp2 /tmp/art/llama-tp2 \
  --out $OUT/llama-logits-tp2-vs-tp1.json > $OUT/logits.log 2>&1
at "logits rc=$?"; python3 -c "import json; d=json.load(open('$OUT/llama-logits-tp2-vs-tp1.json')); print(d.get('logits_tp2_vs_tp1', d.get('error')))" 2>&1 | cut -c1-1500
