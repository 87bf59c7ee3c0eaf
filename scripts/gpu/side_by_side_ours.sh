#!/usr/bin/env bash
# Run on the GPU machine from the repository root (device tool), carrying .whl (zstandard wheel), .gpu
# (configs/ and tokenizers/qwen3 copied from ../shared/models) and .vllm/{bundle.part00,SHA256SUMS,install.sh,sbs.py}
# (../shared/tools/vllm-peer: make_bundle.sh .vllm; cp sbs.py .vllm/). Then send .vllm/bundle.part01..04 in four
# back-to-back calls (mkdir -p /tmp/vstage && cp .vllm/bundle.part0N /tmp/vstage/) and run side_by_side_vllm.sh last.
# GPU call A: stage vLLM part 0; our engine on Qwen3-0.6B random weights, measured with the shared harness.
set -o pipefail
mkdir -p /tmp/vstage && cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_export.py tests/test_triton_compile.py 2>&1 | tail -3
python3 scripts/make_random_model.py --config .gpu/configs/qwen3-0.6b.json --tokenizer .gpu/tokenizers/qwen3 --out /tmp/m/qwen3-0.6b --device cuda >/dev/null || exit 2
python3 -m atom_aot.build.cli --model /tmp/m/qwen3-0.6b --max-model-len 4096 --out /tmp/art/qwen3.atom 2>&1 | grep -v "it/s\]" | tail -6 || exit 3
python3 -m atom_aot.entrypoints.run_cli /tmp/art/qwen3.atom inspect > $OUT/inspect.txt 2>&1
python3 -m atom_aot.entrypoints.run_cli /tmp/art/qwen3.atom verify >> $OUT/inspect.txt 2>&1
python3 .vllm/sbs.py ours --model /tmp/m/qwen3-0.6b --artifact /tmp/art/qwen3.atom --out $OUT/sbs-ours-qwen3-0.6b.json --sections cold,throughput,tpot 2>&1 | tail -40
python3 scripts/profile_decode.py --artifact /tmp/art/qwen3.atom --out $OUT/profile-after.json 2>&1 | grep -E "^B=|wall_ms|gpu_kernel|\"attention\"|merge" | head -60
