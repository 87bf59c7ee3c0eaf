#!/usr/bin/env bash
# Session 32, calls B and C (carry .whl .gpu .vllm/sbs.py): Llama-3.1-8B FP8 W8A8 + FP8 KV (small-M GEMM per-K-step
# default, its torch.cond in the mixed phase). The build alone runs ~10 min on the H100 host, past one call's 600 s:
# call B runs it until the time limit, keeping its finished stages under --cache-dir; call C runs the same command,
# which resumes from them (build/resume.py), then measures (SBS=1: sbs.py ours, throughput and batch-1 TPOT).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
LLAMA=/tmp/m/llama-3.1-8b; S=$(date +%s)
mkdir -p $LLAMA /tmp/art && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
ls -la /tmp/atom-cache/partial/*/ 2>/dev/null | tail -5
timeout ${BUILD_S:-585} python3 -m atom_aot.build.cli --model $LLAMA --load-format dummy --max-model-len 4096 --quant fp8 \
  --kv-cache-dtype fp8 --cache-dir /tmp/atom-cache --out /tmp/art/llama-fp8 > $OUT/build-fp8.log 2>&1
echo "fp8 build rc=$? at $(( $(date +%s) - S )) s"
tr '\r' '\n' < $OUT/build-fp8.log | grep -v "^\s*$" | awk '!s[$0]++' | grep -E "Error|rror:|█|resumed" | grep -v " 0/" | tail -14
ls -la /tmp/atom-cache/partial/*/ 2>/dev/null | tail -5
[ -d /tmp/art/llama-fp8 ] || exit 1
python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-fp8 inspect --measurements > $OUT/inspect-llama-fp8.txt 2>&1
grep -E "decode phase|chosen|small_m|resumed" $OUT/inspect-llama-fp8.txt | head -14
[ "$SBS" = 1 ] || exit 0
timeout $(( 595 - ($(date +%s) - S) )) python3 /tmp/sbs.py ours --model $LLAMA --artifact /tmp/art/llama-fp8 --out $OUT/sbs-ours-llama-fp8.json --sections throughput,tpot > $OUT/sbs-ours.log 2>&1
echo "ours rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-ours.log | tail -4
