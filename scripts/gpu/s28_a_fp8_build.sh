#!/usr/bin/env bash
# Session 28, H100 call A (carry .whl .gpu/configs .gpu/tokenizers/llama3 .vllm/bundle.part00 .vllm/SHA256SUMS
# .vllm/install.sh .vllm/sbs.py): the Llama-3.1-8B random folder; the FP8 W8A8 + FP8 KV artifact (its build is
# the first with the FP8 quantization inlined into the graph); once the build's tuning is over (its compile is
# CPU work), the MoE/FP8 Triton kernel tests on the GPU and the FP8 GEMM paths against bf16 (scripts/bench_fp8.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage && cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; df -h /tmp /dev/shm; free -g; nproc; } > $OUT/machine.txt 2>&1
S=$(date +%s)
python3 scripts/make_random_model.py --config .gpu/configs/llama-3.1-8b.json --tokenizer .gpu/tokenizers/llama3 --out /tmp/m/llama-3.1-8b --device cuda >/dev/null || exit 2
echo "random model: $(( $(date +%s) - S )) s"
timeout 500 python3 -m atom_aot.build.cli --model /tmp/m/llama-3.1-8b --max-model-len 4096 --quant fp8 --kv-cache-dtype fp8 --out /tmp/art/llama-fp8.atom > $OUT/build-fp8.log 2>&1 &
B=$!
for i in $(seq 1 200); do grep -q "export\|compile (" $OUT/build-fp8.log 2>/dev/null && break; sleep 1; done
echo "tuning over at $(( $(date +%s) - S )) s"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_moe.py tests/test_triton_fp8_gemm.py tests/test_triton_fp8_kv.py > $OUT/gpu-tests.log 2>&1; tail -3 $OUT/gpu-tests.log
echo "tests at $(( $(date +%s) - S )) s"
timeout 200 python3 scripts/bench_fp8.py --out $OUT/fp8-gemm.json > $OUT/bench-fp8.log 2>&1; tail -2 $OUT/bench-fp8.log
echo "bench_fp8 at $(( $(date +%s) - S )) s"
wait $B; echo "fp8 build rc=$? at $(( $(date +%s) - S )) s"
grep -v "it/s\]" $OUT/build-fp8.log | grep -E "stages|sizes|Error|error" | tail -5
python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-fp8.atom inspect 2>/dev/null | grep -E "phase|weights|kv cache" > $OUT/inspect-fp8.txt; cat $OUT/inspect-fp8.txt
