#!/usr/bin/env bash
# Session 29, fresh H100, call J (carry .whl .gpu .vllm/bundle.part05 .vllm/sbs.py). Lessons of calls C-E: a
# process started in a call dies with it, and a .atom archive needs the disk twice. So both artifacts are
# folders, built with random weights drawn at build (--load-format dummy, as vLLM's side will load), from
# config + tokenizer folders: Qwen3-30B-A3B's shapes at 16 of its 48 layers (one H100's disk and memory hold
# both engines' copies), and Llama-3.1-8B FP8 W8A8 + FP8 KV. The FP8 build starts once the MoE build's kernel
# tuning is over (their compiles then share the CPUs; neither's tuning shares the GPU).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage && cp .vllm/bundle.part05 /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; df -h /tmp /dev/shm; free -g; nproc; } > $OUT/machine.txt 2>&1
MOE=/tmp/m/qwen3-30b-a3b-16l; LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $MOE $LLAMA /tmp/art && cp .gpu/tokenizers/qwen3/* $MOE/ && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
python3 -c "import json; c=json.load(open('.gpu/configs/qwen3-30b-a3b.json')); c['num_hidden_layers']=16; c['max_window_layers']=16; json.dump(c, open('$MOE/config.json','w'), indent=1)"
S=$(date +%s)
timeout 575 python3 -m atom_aot.build.cli --model $MOE --load-format dummy --max-model-len 4096 --out /tmp/art/moe-16l > $OUT/build-moe.log 2>&1 &
B1=$!
for i in $(seq 1 300); do grep -q "export (" $OUT/build-moe.log 2>/dev/null && break; kill -0 $B1 2>/dev/null || break; sleep 1; done
echo "moe tuning over at $(( $(date +%s) - S )) s"
timeout $(( 575 - ($(date +%s) - S) )) python3 -m atom_aot.build.cli --model $LLAMA --load-format dummy --max-model-len 4096 --quant fp8 --kv-cache-dtype fp8 --out /tmp/art/llama-fp8 > $OUT/build-fp8.log 2>&1 &
B2=$!
wait $B1; echo "moe build rc=$? at $(( $(date +%s) - S )) s"
wait $B2; echo "fp8 build rc=$? at $(( $(date +%s) - S )) s"
for f in moe fp8; do tr '\r' '\n' < $OUT/build-$f.log | grep -v "^\s*$" | awk '!s[$0]++' | grep -E "stages|Error|rror:" | tail -2; done
df -h /tmp | tail -1
