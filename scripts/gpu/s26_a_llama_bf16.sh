#!/usr/bin/env bash
# Session 26, GPU call A (carry .whl .gpu .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py):
# stage vLLM part 0; Llama-3.1-8B random bf16 weights; build it; our engine through the shared harness.
set -o pipefail
mkdir -p /tmp/vstage && cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
S=$(date +%s)
python3 scripts/make_random_model.py --config .gpu/configs/llama-3.1-8b.json --tokenizer .gpu/tokenizers/llama3 --out /tmp/m/llama-3.1-8b --device cuda >/dev/null || exit 2
echo "random model: $(( $(date +%s) - S )) s"
/usr/bin/time -v timeout 420 python3 -m atom_aot.build.cli --model /tmp/m/llama-3.1-8b --max-model-len 4096 --out /tmp/art/llama.atom > $OUT/build-bf16.log 2>&1 || { tail -30 $OUT/build-bf16.log; exit 3; }
grep -v "it/s\]" $OUT/build-bf16.log | grep -i -E "stages|sizes|Elapsed|Maximum resident" | tail -6
python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama.atom inspect > $OUT/inspect-bf16.txt 2>&1
timeout 240 python3 .vllm/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama.atom --out $OUT/sbs-ours-llama-3.1-8b.json --sections cold,throughput,tpot 2>&1 | grep -v -i "warn" | grep -E "first_token|tok_s|tpot_s\"|init_s|seconds" | head -20
echo "call A total: $(( $(date +%s) - S )) s"
