#!/usr/bin/env bash
# Session 26, second machine, call A (carry .whl .gpu/configs .gpu/tokenizers/llama3): the Llama-3.1-8B random
# folder again; the FP8 W8A8 + FP8 KV artifact and the bf16 one, the bf16 build started once the FP8 build's
# tuning is over (so neither build times kernels while the other runs GPU work; their compiles overlap on the CPU).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee $OUT/gpu.txt
S=$(date +%s)
python3 scripts/make_random_model.py --config .gpu/configs/llama-3.1-8b.json --tokenizer .gpu/tokenizers/llama3 --out /tmp/m/llama-3.1-8b --device cuda >/dev/null || exit 2
echo "random model: $(( $(date +%s) - S )) s"
timeout 470 python3 -m atom_aot.build.cli --model /tmp/m/llama-3.1-8b --max-model-len 4096 --quant fp8 --kv-cache-dtype fp8 --out /tmp/art/llama-fp8.atom > $OUT/build-fp8.log 2>&1 &
FP8=$!
for i in $(seq 1 150); do grep -q "export (mixed)\|compile (mixed)\|Compil" $OUT/build-fp8.log 2>/dev/null && break; sleep 1; done
echo "bf16 build starts at $(( $(date +%s) - S )) s"
timeout 430 python3 -m atom_aot.build.cli --model /tmp/m/llama-3.1-8b --max-model-len 4096 --out /tmp/art/llama.atom > $OUT/build-bf16.log 2>&1 &
BF16=$!
wait $FP8; echo "fp8 build rc=$? at $(( $(date +%s) - S )) s"
wait $BF16; echo "bf16 build rc=$? at $(( $(date +%s) - S )) s"
for f in fp8 bf16; do grep -v "it/s\]" $OUT/build-$f.log | grep -E "stages|sizes|Error" | tail -3; done
