#!/usr/bin/env bash
# Session 29, call E (carry .vllm/bundle.part02): call C's FP8 build was killed in its last stage (pack) at the
# call's limit (cold Inductor cache: compile 3 + 1.6 min); again, on the warm cache, then our FP8 side.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
rm -rf /tmp/art/llama-fp8.atom*
timeout 400 python3 -m atom_aot.build.cli --model /tmp/m/llama-3.1-8b --max-model-len 4096 --quant fp8 --kv-cache-dtype fp8 --out /tmp/art/llama-fp8.atom > $OUT/build-fp8.log 2>&1
echo "fp8 build rc=$? at $(( $(date +%s) - S )) s"
python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-fp8.atom inspect > $OUT/inspect-fp8.txt 2>&1; grep -E "phase|kv cache|attention" $OUT/inspect-fp8.txt | head -8
timeout 150 python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-fp8.atom --out $OUT/sbs-ours-llama-3.1-8b-fp8.json --sections throughput,tpot > $OUT/sbs-ours-fp8.log 2>&1
echo "ours fp8 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s" $OUT/sbs-ours-fp8.log | tail -3
