#!/usr/bin/env bash
# Next nvidia-h100-x2 session, call A (carry .whl .gpu .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh
# .vllm/sbs.py): stage vLLM part 0; the all-reduce table on idle GPUs (NCCL, atom::all_reduce eager and in CUDA
# graphs, symmetric-memory one-shot / two-shot); Llama-3.1-8B -tp 2 (GPU 0) and -tp 1 dummy-at-load (GPU 1) built
# side by side with nothing else on the GPUs; then the tiny fp32 TP-2 == TP-1 check and the bf16 logits TP-2 vs
# TP-1 once both builds are done.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage && cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 150 python3 scripts/gpu/tp_two_gpus.py collectives --out $OUT/h100x2-collectives.json > $OUT/collectives.log 2>&1
echo "collectives rc=$? at $(( $(date +%s) - S )) s"
python3 -c "import json; d=json.load(open('$OUT/h100x2-collectives.json.rows.json')); [print(r) for r in d['rows']]" 2>&1 | cut -c1-400
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA /tmp/art && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
B="python3 -m atom_aot.build.cli --model $LLAMA --max-model-len 4096 --cache-dir /tmp/atom-cache"
CUDA_VISIBLE_DEVICES=0 timeout $(( 480 - ($(date +%s) - S) )) $B --load-format dummy -tp 2 --out /tmp/art/llama-tp2 > $OUT/build-tp2.log 2>&1 &
P2=$!
CUDA_VISIBLE_DEVICES=1 timeout $(( 480 - ($(date +%s) - S) )) $B --load-format dummy-at-load --out /tmp/art/llama-tp1 > $OUT/build-tp1.log 2>&1 &
P1=$!
wait $P2; echo "tp2 build rc=$? at $(( $(date +%s) - S )) s"
wait $P1; echo "tp1 build rc=$? at $(( $(date +%s) - S )) s"
for f in tp2 tp1; do tr '\r' '\n' < $OUT/build-$f.log | grep -v "^\s*$" | awk '!s[$0]++' | grep -E "stages|Error|rror:" | tail -2; done
timeout $(( 585 - ($(date +%s) - S) )) python3 scripts/gpu/tp_two_gpus.py logits --tp1 /tmp/art/llama-tp1 --tp2 /tmp/art/llama-tp2 \
  --out $OUT/h100x2-llama-logits-tp2-vs-tp1.json > $OUT/logits.log 2>&1
echo "logits rc=$? at $(( $(date +%s) - S )) s"; grep -E "max_abs|argmax|greedy|rror" $OUT/h100x2-llama-logits-tp2-vs-tp1.json | head -12
