#!/usr/bin/env bash
# Session 39, call D (a fresh machine after call C found none warm; carry .whl .gpu/configs .gpu/tokenizers/llama3
# .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py): stage vLLM part 5 again; rebuild Llama-3.1-8B
# -tp 2 (GPU 0) and -tp 4 (GPU 1) side by side, so that both engines run on this machine.
LOGS=/tmp/s39; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
B="python3 -m atom_aot.build.cli --model $LLAMA --max-model-len 4096 --load-format dummy --cache-dir /tmp/atom-cache"
for tp in 2 4; do
  CUDA_VISIBLE_DEVICES=$(( tp / 2 - 1 )) timeout 540 $B -tp $tp --out /tmp/art/llama-tp$tp > $LOGS/build-tp$tp.log 2>&1 &
done; wait; at "builds done"
for f in tp2 tp4; do echo "$f $(tr '\r' '\n' < $LOGS/build-$f.log | grep -E '^stages|rror' | tail -1)"; done | tee $OUT/build-stages-d.txt | cut -c1-400
ls /tmp/art /tmp/vstage | tr '\n' ' '
