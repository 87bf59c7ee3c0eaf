#!/usr/bin/env bash
# Session 32, call A (carry .whl .gpu .vllm/bundle.part05 .vllm/sbs.py): Llama-3.1-8B FP8 W8A8 + FP8 KV rebuilt
# with the fp8 decode attention widening e4m3 by PTX before the MMA layout change (FP8_CVT_PTX) and the small-M
# GEMM's per-K-step default; once the build's GPU tuning is over, the attention tests on the GPU (PTX widening
# against Triton's conversion and float64 on every candidate) and bench_fp8_attention with both widenings.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage && cp .vllm/bundle.part05 /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; df -h /tmp; nproc; } > $OUT/machine.txt 2>&1
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA /tmp/art && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
S=$(date +%s)
timeout 575 python3 -m atom_aot.build.cli --model $LLAMA --load-format dummy --max-model-len 4096 --quant fp8 --kv-cache-dtype fp8 --out /tmp/art/llama-fp8 > $OUT/build-fp8.log 2>&1 &
B1=$!
for i in $(seq 1 300); do grep -q "export (" $OUT/build-fp8.log 2>/dev/null && break; kill -0 $B1 2>/dev/null || break; sleep 1; done
echo "fp8 tuning over at $(( $(date +%s) - S )) s"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_attention.py tests/test_triton_fp8_kv.py > $OUT/test-attention-gpu.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - S )) s"; grep -E "FAILED|passed|failed|Error" $OUT/test-attention-gpu.log | tail -12
timeout 200 python3 scripts/bench_fp8_attention.py --out $OUT/fp8-attention-ptx.json --variants "bf16,fp8->fp16,fp8->fp16 ptx" --budget-s 170 > $OUT/bench.log 2>&1
echo "bench rc=$? at $(( $(date +%s) - S )) s"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/fp8-attention-ptx.json"))
print("copy GB/s", round(d["copy_gbps"]))
for m, v in d["models"].items():
    print(v["rel_error_vs_float64"])
    for k, b in v["best"].items(): print(k, b["ms"], b["gbps"], b["config"])
PY
wait $B1; echo "fp8 build rc=$? at $(( $(date +%s) - S )) s"
tr '\r' '\n' < $OUT/build-fp8.log | grep -v "^\s*$" | awk '!s[$0]++' | grep -E "stages|Error|rror:" | tail -3
[ -d /tmp/art/llama-fp8 ] || exit 1
python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-fp8 inspect --measurements > $OUT/inspect-llama-fp8.txt 2>&1
grep -E "decode phase|fp8_linear / decode / chosen|attention" $OUT/inspect-llama-fp8.txt | head -12
df -h /tmp | tail -1
