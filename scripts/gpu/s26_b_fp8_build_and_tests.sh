#!/usr/bin/env bash
# Session 26, GPU call B (carry .vllm/bundle.part01): the GPU tests (greedy parity with transformers, graphs,
# async == sync, no runtime compilation) while the FP8 W8A8 + FP8 KV artifact of the same Llama folder builds.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 480 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $OUT/test_gpu.log 2>&1 &
TESTS=$!
/usr/bin/time -v timeout 500 python3 -m atom_aot.build.cli --model /tmp/m/llama-3.1-8b --max-model-len 4096 --quant fp8 --kv-cache-dtype fp8 --out /tmp/art/llama-fp8.atom > $OUT/build-fp8.log 2>&1 || tail -30 $OUT/build-fp8.log
grep -v "it/s\]" $OUT/build-fp8.log | grep -i -E "stages|sizes|Elapsed|Maximum resident" | tail -6
python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-fp8.atom inspect > $OUT/inspect-fp8.txt 2>&1
echo "fp8 build done at $(( $(date +%s) - S )) s"
wait $TESTS; tail -8 $OUT/test_gpu.log
echo "call B total: $(( $(date +%s) - S )) s"
