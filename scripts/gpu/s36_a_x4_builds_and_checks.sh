#!/usr/bin/env bash
# Planned for the next nvidia-h100-x4 / h200-x4 session, call A (carry .whl .gpu/configs .gpu/tokenizers/llama3
# .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py). Llama-3.1-8B -tp 2 (GPU 0), -tp 4 (GPU 1) and
# -tp 1 dummy-at-load (GPU 2) built side by side while GPUs 2,3 time the 2-rank all-reduce (before the -tp 1 build
# starts there) and the tiny fp32 TP-2/TP-4 == TP-1 check runs on all four (correctness only), each engine in a
# fresh process, then again one after another in one process (session 35's faults: close, rejoin); then the
# 4-rank all-reduce table on idle GPUs and the bf16 logits TP-2 vs TP-1. Logs stay in /tmp/s36 (at most 8 files
# come back from $OUT); the artifacts stay in /tmp/art for calls B (TP=2 / TP=4 bash scripts/gpu/s35_b_ours_tp2.sh)
# and F (TP=2 / TP=4 bash scripts/gpu/s35_f_vllm_tp2.sh).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage /tmp/s35 /tmp/s36 && cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c; env | grep -E "^(NCCL_NVLS|TORCH_SYMM|NVSHMEM)" | tr '\n' ' '; echo
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA /tmp/art && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
B="python3 -m atom_aot.build.cli --model $LLAMA --max-model-len 4096 --cache-dir /tmp/atom-cache"
CUDA_VISIBLE_DEVICES=0 timeout 400 $B --load-format dummy -tp 2 --out /tmp/art/llama-tp2 > /tmp/s36/build-tp2.log 2>&1 &
P2=$!
CUDA_VISIBLE_DEVICES=1 timeout 400 $B --load-format dummy -tp 4 --out /tmp/art/llama-tp4 > /tmp/s36/build-tp4.log 2>&1 &
P4=$!
T="python3 scripts/gpu/tp_two_gpus.py"
CUDA_VISIBLE_DEVICES=2,3 timeout 100 $T collectives --out /tmp/s36/collectives-2gpu.json > /tmp/s36/collectives-2gpu.log 2>&1
at "collectives 2 GPUs rc=$?"; cp /tmp/s36/collectives-2gpu.json $OUT/
$T plan --table /tmp/s36/collectives-2gpu.json | tee /tmp/s35/plan-2gpu.env
CUDA_VISIBLE_DEVICES=2 timeout 400 $B --load-format dummy-at-load --out /tmp/art/llama-tp1 > /tmp/s36/build-tp1.log 2>&1 &
P1=$!
timeout 200 $T tiny --out $OUT/tiny-tp.json > /tmp/s36/tiny.log 2>&1; at "tiny (fresh processes) rc=$?"
timeout 120 $T tiny --tiny-models 1 --same-process --out $OUT/tiny-tp-same-process.json > /tmp/s36/tiny-same.log 2>&1
at "tiny (one process) rc=$?"; grep -E "all-reduce|rror" /tmp/s36/tiny-same.log | sort | uniq -c | cut -c1-200
python3 -c "
import json
for f in ('tiny-tp.json', 'tiny-tp-same-process.json'):
    d = json.load(open('$OUT/' + f)); print(f, d.get('tiny_fp32_greedy'), d.get('error'))" 2>&1 | cut -c1-700
for p in $P2 $P4 $P1; do wait $p; at "build pid $p rc=$?"; done
for f in tp2 tp4 tp1; do echo "$f $(tr '\r' '\n' < /tmp/s36/build-$f.log | grep -E '^stages|rror' | tail -1)"; done | tee $OUT/build-stages.txt | cut -c1-300
timeout $(( 480 - ($(date +%s) - S) )) $T collectives --out /tmp/s36/collectives-4gpu.json > /tmp/s36/collectives-4gpu.log 2>&1
at "collectives 4 GPUs rc=$?"; cp /tmp/s36/collectives-4gpu.json $OUT/; $T plan --table /tmp/s36/collectives-4gpu.json | tee /tmp/s35/plan-4gpu.env
timeout $(( 585 - ($(date +%s) - S) )) $T logits --tp1 /tmp/art/llama-tp1 --tp2 /tmp/art/llama-tp2 --out $OUT/llama-logits-tp2-vs-tp1.json > /tmp/s36/logits.log 2>&1
at "logits rc=$?"; python3 -c "import json; d=json.load(open('$OUT/llama-logits-tp2-vs-tp1.json')); print(d.get('logits_tp2_vs_tp1', d.get('error')))" 2>&1 | cut -c1-1500
