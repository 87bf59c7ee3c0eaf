#!/usr/bin/env bash
# Session 34, nvidia-h100-x2 call A (carry .whl .gpu .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh
# .vllm/sbs.py): stage vLLM part 0; the all-reduce table (NCCL vs symmetric memory, two GPUs) on idle GPUs; then
# Llama-3.1-8B random weights (--load-format dummy, the same draw for both) built at -tp 2 (stored weights, for
# the cold start) on GPU 0 and at -tp 1 (dummy-at-load, for the logits comparison) on GPU 1, side by side; the
# tiny fp32 TP-2 == TP-1 greedy check once both builds' kernel tuning is over (it uses both GPUs).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage && cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; nvidia-smi topo -m; env | grep -E "NCCL|SYMM|NVSHMEM"; df -h /tmp; free -g; nproc; } > $OUT/machine.txt 2>&1
S=$(date +%s)
timeout 120 python3 scripts/gpu/tp_two_gpus.py collectives --out $OUT/h100x2-collectives.json > $OUT/collectives.log 2>&1
echo "collectives rc=$? at $(( $(date +%s) - S )) s"; grep -E "error|Error" $OUT/collectives.log | head -5
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA /tmp/art && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
B="python3 -m atom_aot.build.cli --model $LLAMA --max-model-len 4096 --cache-dir /tmp/atom-cache"
CUDA_VISIBLE_DEVICES=0 timeout $(( 585 - ($(date +%s) - S) )) $B --load-format dummy -tp 2 --out /tmp/art/llama-tp2 > $OUT/build-tp2.log 2>&1 &
P2=$!
CUDA_VISIBLE_DEVICES=1 timeout $(( 585 - ($(date +%s) - S) )) $B --load-format dummy-at-load --out /tmp/art/llama-tp1 > $OUT/build-tp1.log 2>&1 &
P1=$!
for i in $(seq 1 300); do grep -q "export (" $OUT/build-tp2.log 2>/dev/null && grep -q "export (" $OUT/build-tp1.log 2>/dev/null && break; sleep 1; done
echo "tuning over at $(( $(date +%s) - S )) s"
timeout $(( 560 - ($(date +%s) - S) )) python3 scripts/gpu/tp_two_gpus.py tiny --out $OUT/h100x2-tiny-tp2.json > $OUT/tiny.log 2>&1
echo "tiny rc=$? at $(( $(date +%s) - S )) s"; grep -E "equal|error" $OUT/h100x2-tiny-tp2.json | head -8
wait $P2; echo "tp2 build rc=$? at $(( $(date +%s) - S )) s"
wait $P1; echo "tp1 build rc=$? at $(( $(date +%s) - S )) s"
for f in tp2 tp1; do tr '\r' '\n' < $OUT/build-$f.log | grep -v "^\s*$" | awk '!s[$0]++' | grep -E "stages|Error|rror:" | tail -3; done
[ -d /tmp/art/llama-tp2 ] && python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp2 inspect --measurements > $OUT/inspect-llama-tp2.txt 2>&1
python3 -c "import json; d=json.load(open('$OUT/h100x2-collectives.json')); print(json.dumps(d.get('collectives', d), indent=None)[:3000])"
