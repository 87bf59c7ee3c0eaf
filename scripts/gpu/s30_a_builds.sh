#!/usr/bin/env bash
# Session 30, fresh H100, call A (carry .whl .gpu .vllm/bundle.part05 .vllm/sbs.py): the attention kernel's new
# unmasked path checked on the GPU first (a failure ends the call), then two Llama-3.1-8B folder artifacts with
# random weights drawn at build (--load-format dummy): FP8 W8A8 + FP8 KV, and bf16; the second build starts once
# the first one's kernel tuning is over (their compiles share the CPUs, their tunings never share the GPU).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage && cp .vllm/bundle.part05 /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; df -h /tmp /dev/shm; free -g; nproc; } > $OUT/machine.txt 2>&1
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA /tmp/art && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
S=$(date +%s)
timeout 570 python3 -m atom_aot.build.cli --model $LLAMA --load-format dummy --max-model-len 4096 --quant fp8 --kv-cache-dtype fp8 --out /tmp/art/llama-fp8 > $OUT/build-fp8.log 2>&1 &
B1=$!
timeout 150 python3 -m pytest -q -x tests/test_triton_attention.py -k "full_key or every_candidate or bf16_model_shapes or chunks" > $OUT/test-attention-gpu.log 2>&1
T=$?; echo "attention tests rc=$T at $(( $(date +%s) - S )) s"; tail -2 $OUT/test-attention-gpu.log
if grep -qE "[0-9]+ failed|[0-9]+ error" $OUT/test-attention-gpu.log; then kill $B1; exit 1; fi
for i in $(seq 1 300); do grep -q "export (" $OUT/build-fp8.log 2>/dev/null && break; kill -0 $B1 2>/dev/null || break; sleep 1; done
echo "fp8 tuning over at $(( $(date +%s) - S )) s"
timeout $(( 570 - ($(date +%s) - S) )) python3 -m atom_aot.build.cli --model $LLAMA --load-format dummy --max-model-len 4096 --out /tmp/art/llama-bf16 > $OUT/build-bf16.log 2>&1 &
B2=$!
wait $B1; echo "fp8 build rc=$? at $(( $(date +%s) - S )) s"
wait $B2; echo "bf16 build rc=$? at $(( $(date +%s) - S )) s"
for f in fp8 bf16; do tr '\r' '\n' < $OUT/build-$f.log | grep -v "^\s*$" | awk '!s[$0]++' | grep -E "stages|Error|rror:" | tail -2; done
for a in llama-fp8 llama-bf16; do [ -d /tmp/art/$a ] && python3 -m atom_aot.entrypoints.run_cli /tmp/art/$a inspect --measurements > $OUT/inspect-$a.txt 2>&1; done
df -h /tmp | tail -1
