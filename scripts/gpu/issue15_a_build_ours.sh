#!/usr/bin/env bash
# Issue 15, GPU call A (carry .whl .gpu .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py):
# stage vLLM part 0; build Qwen3-0.6B (random bf16 weights) and measure our engine with the shared harness.
set -o pipefail
mkdir -p /tmp/vstage && cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
python3 scripts/make_random_model.py --config .gpu/configs/qwen3-0.6b.json --tokenizer .gpu/tokenizers/qwen3 --out /tmp/m/qwen3-0.6b --device cuda >/dev/null || exit 2
/usr/bin/time -v python3 -m atom_aot.build.cli --model /tmp/m/qwen3-0.6b --max-model-len 4096 --out /tmp/art/qwen3.atom > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 3; }
grep -v "it/s\]" $OUT/build.log | grep -i -E "stage|build|seconds|Elapsed|Maximum resident" | tail -12
python3 -m atom_aot.entrypoints.run_cli /tmp/art/qwen3.atom inspect > $OUT/inspect.txt 2>&1
timeout 300 python3 .vllm/sbs.py ours --model /tmp/m/qwen3-0.6b --artifact /tmp/art/qwen3.atom --out $OUT/sbs-ours-qwen3-0.6b.json --sections throughput,tpot,cold 2>&1 | grep -v -i "warn" | tail -25
