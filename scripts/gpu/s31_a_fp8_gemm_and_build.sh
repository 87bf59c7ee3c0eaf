#!/usr/bin/env bash
# Session 31, call A (carry .whl .gpu): the FP8 GEMM at decode sizes on Llama-3.1-8B's shapes (bench_fp8.py with
# small-N Triton configs beside the build's candidates), while a Llama-3.1-8B FP8 W8A8 + FP8 KV folder artifact
# (random weights drawn at build) compiles; the bench starts once the build's GPU tuning is over.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; df -h /tmp; nproc; } > $OUT/machine.txt 2>&1
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA /tmp/art && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
S=$(date +%s)
timeout 575 python3 -m atom_aot.build.cli --model $LLAMA --load-format dummy --max-model-len 4096 --quant fp8 --kv-cache-dtype fp8 --out /tmp/art/llama-fp8 > $OUT/build-fp8.log 2>&1 &
B1=$!
for i in $(seq 1 300); do grep -q "export (" $OUT/build-fp8.log 2>/dev/null && break; kill -0 $B1 2>/dev/null || break; sleep 1; done
echo "fp8 tuning over at $(( $(date +%s) - S )) s"
EXTRA="16,16,256,4,4;16,32,256,4,4;16,32,128,4,6;16,64,256,4,4;16,16,512,4,3;16,32,512,4,3;16,32,256,2,4;16,16,256,2,6"
timeout 300 python3 scripts/bench_fp8.py --out $OUT/fp8-gemm-small-m.json --tokens 1,4,16,64 --budget-s 240 --extra-configs "$EXTRA" > $OUT/bench.log 2>&1
echo "bench rc=$? at $(( $(date +%s) - S )) s"; tail -3 $OUT/bench.log
wait $B1; echo "fp8 build rc=$? at $(( $(date +%s) - S )) s"
tr '\r' '\n' < $OUT/build-fp8.log | grep -v "^\s*$" | awk '!s[$0]++' | grep -E "stages|Error|rror:" | tail -2
[ -d /tmp/art/llama-fp8 ] && python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-fp8 inspect --measurements > $OUT/inspect-llama-fp8.txt 2>&1
df -h /tmp | tail -1
