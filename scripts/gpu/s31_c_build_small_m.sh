#!/usr/bin/env bash
# Session 31, call C (carry .whl .gpu .vllm/bundle.part05 .vllm/sbs.py): Llama-3.1-8B FP8 W8A8 + FP8 KV rebuilt with
# the small-M decode kernel among the candidates; once its GPU tuning is over, the fp8 kernels' tests on the GPU
# (the small-M kernel, the torch.cond package test, every fp8_gemm config) and the decode-size GEMM bench with both
# accumulations; then the batch-1 and batch-16 decode profiles of the new artifact.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage && cp .vllm/bundle.part05 /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA /tmp/art && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
S=$(date +%s)
timeout 560 python3 -m atom_aot.build.cli --model $LLAMA --load-format dummy --max-model-len 4096 --quant fp8 --kv-cache-dtype fp8 --out /tmp/art/llama-fp8 > $OUT/build-fp8.log 2>&1 &
B1=$!
for i in $(seq 1 300); do grep -q "export (" $OUT/build-fp8.log 2>/dev/null && break; kill -0 $B1 2>/dev/null || break; sleep 1; done
echo "fp8 tuning over at $(( $(date +%s) - S )) s"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_triton_fp8_small_m.py tests/test_triton_fp8_gemm.py > $OUT/test-fp8-gpu.log 2>&1
echo "tests rc=$? at $(( $(date +%s) - S )) s"; grep -E "FAILED|passed|failed" $OUT/test-fp8-gpu.log | tail -12
timeout 150 python3 scripts/bench_fp8_decode_gemm.py --out $OUT/fp8-decode-gemm-acc.json --tokens 1,16 --all-accumulations --budget-s 120 > $OUT/bench.log 2>&1
echo "bench rc=$? at $(( $(date +%s) - S )) s"; tail -8 $OUT/bench.log
wait $B1; echo "fp8 build rc=$? at $(( $(date +%s) - S )) s"
tr '\r' '\n' < $OUT/build-fp8.log | grep -v "^\s*$" | awk '!s[$0]++' | grep -E "stages|Error|rror:" | tail -3
[ -d /tmp/art/llama-fp8 ] || exit 1
python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-fp8 inspect --measurements > $OUT/inspect-llama-fp8.txt 2>&1
grep -E "decode phase|fp8_linear / decode / chosen" $OUT/inspect-llama-fp8.txt
timeout $(( 590 - ($(date +%s) - S) )) python3 scripts/profile_decode.py --artifact /tmp/art/llama-fp8 --out $OUT/fp8-b1-profile.json --batch 1 --input-len 512 --sections step,kernels --warm-steps 32 --steps 64 > $OUT/p1.log 2>&1
echo "profile rc=$? at $(( $(date +%s) - S )) s"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/fp8-b1-profile.json"))
print("b1 step ms", round(d["step"]["wall_ms_per_step_median"], 3), {k: round(v, 3) for k, v in d["kernels"]["category_ms_per_step"].items()})
for t in d["kernels"]["top_kernels"][:6]: print(round(t["ms_per_step"], 4), t["calls_per_step"], t["name"][:90])
PY
