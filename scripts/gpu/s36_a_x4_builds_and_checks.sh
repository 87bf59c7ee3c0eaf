#!/usr/bin/env bash
# Session 36, multi-GPU call A (carry .whl .gpu/configs .gpu/tokenizers .vllm/bundle.part05 .vllm/SHA256SUMS
# .vllm/install.sh .vllm/sbs.py): stage vLLM part 5. Four builds side by side, one per GPU: Llama-3.1-8B -tp 2
# (weights drawn at build), Llama-3.1-8B -tp 1 dummy-at-load (the same weights, drawn at load: the logits reference),
# Qwen3-30B-A3B's shapes at 16 of its 48 layers -tp 2 and -tp 2 --ep (dummy-at-load; 16 layers because a 48-layer
# compile does not fit one 10-minute call). Beside them the tiny fp32 TP-2/TP-4 == TP-1 check (each engine in a fresh
# process, then one after another in one process); once the Llama builds are done, the bf16 logits TP-2 vs TP-1 on
# GPUs 0,1. Logs stay in /tmp/s36 (at most 8 files come back); artifacts in /tmp/art for calls B and after.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage /tmp/s36 /tmp/art && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c; nproc; env | grep -E "^(NCCL_NVLS|TORCH_SYMM|NVSHMEM)" | tr '\n' ' '; echo
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
LLAMA=/tmp/m/llama-3.1-8b MOE=/tmp/m/qwen3-30b-a3b-16l
mkdir -p $LLAMA $MOE && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json && cp .gpu/tokenizers/qwen3/* $MOE/
python3 -c "
import json; c = json.load(open('.gpu/configs/qwen3-30b-a3b.json')); c['num_hidden_layers'] = 16; c['max_window_layers'] = 16
json.dump(c, open('$MOE/config.json', 'w'), indent=1)"
B="python3 -m atom_aot.build.cli --max-model-len 4096 --cache-dir /tmp/atom-cache"
CUDA_VISIBLE_DEVICES=0 timeout 420 $B --model $LLAMA --load-format dummy -tp 2 --out /tmp/art/llama-tp2 > /tmp/s36/build-tp2.log 2>&1 &
P2=$!
CUDA_VISIBLE_DEVICES=1 timeout 420 $B --model $LLAMA --load-format dummy-at-load --out /tmp/art/llama-tp1 > /tmp/s36/build-tp1.log 2>&1 &
P1=$!
CUDA_VISIBLE_DEVICES=2 timeout 565 $B --model $MOE --load-format dummy-at-load -tp 2 --out /tmp/art/moe-tp2 > /tmp/s36/build-moe-tp2.log 2>&1 &
PM=$!
CUDA_VISIBLE_DEVICES=3 timeout 565 $B --model $MOE --load-format dummy-at-load -tp 2 --ep --out /tmp/art/moe-ep2 > /tmp/s36/build-moe-ep2.log 2>&1 &
PE=$!
T="python3 scripts/gpu/tp_two_gpus.py"
timeout 240 $T tiny --out $OUT/tiny-tp.json > /tmp/s36/tiny.log 2>&1; at "tiny (fresh processes) rc=$?"
timeout 120 $T tiny --tiny-models 1 --same-process --out $OUT/tiny-tp-same-process.json > /tmp/s36/tiny-same.log 2>&1
at "tiny (one process) rc=$?"; grep -E "all-reduce|rror" /tmp/s36/tiny-same.log | sort | uniq -c | cut -c1-200
python3 -c "
import json
for f in ('tiny-tp.json', 'tiny-tp-same-process.json'):
    d = json.load(open('$OUT/' + f)); print(f, d.get('tiny_fp32_greedy'), d.get('error'))" 2>&1 | cut -c1-900
for p in $P2 $P1; do wait $p; at "llama build pid $p rc=$?"; done
CUDA_VISIBLE_DEVICES=0,1 timeout $(( 575 - ($(date +%s) - S) )) $T logits --tp1 /tmp/art/llama-tp1 --tp2 /tmp/art/llama-tp2 --out $OUT/llama-logits-tp2-vs-tp1.json > /tmp/s36/logits.log 2>&1
at "logits rc=$?"; python3 -c "import json; d=json.load(open('$OUT/llama-logits-tp2-vs-tp1.json')); print(d.get('logits_tp2_vs_tp1', d.get('error')))" 2>&1 | cut -c1-1500
for p in $PM $PE; do wait $p; at "moe build pid $p rc=$?"; done
for f in tp2 tp1 moe-tp2 moe-ep2; do echo "$f $(tr '\r' '\n' < /tmp/s36/build-$f.log | grep -E '^stages|rror' | tail -1)"; done | tee $OUT/build-stages.txt | cut -c1-400
grep -h -E "fused_moe|expert" /tmp/s36/build-moe-*.log | sort | uniq -c | head -6 | cut -c1-300
cp /tmp/s36/tiny.log /tmp/s36/logits.log $OUT/ 2>/dev/null; ls /tmp/art
