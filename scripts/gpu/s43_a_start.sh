#!/usr/bin/env bash
# Session 43, one H200 (needs_h200), call A (carry .whl .gpu/configs .gpu/tokenizers .vllm/bundle.part05
# .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py): issue 18's full-size MoE models, one per machine. M names the
# config (qwen3-30b-a3b: 61 GB of bf16 weights, or mixtral-8x7b: 93 GB) and TOK its tokenizer folder (qwen3, or
# mixtral32k: Llama-3's cut to Mixtral's 32,000 ids by small_vocab_tokenizer.py). Starts the build detached (setsid:
# it outlives the call while calls B-E stage vLLM): weights drawn at load (the 64 GB disk holds neither model's
# weights), and beside it checks the `sample` package end to end (session 42; every GPU build now compiles it).
LOGS=/tmp/s43; source scripts/gpu/prelude.sh
M=${M:-qwen3-30b-a3b} TOK=${TOK:-qwen3}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; df -h /tmp | tail -1
mkdir -p /tmp/vstage /tmp/m/$M && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
cp .gpu/tokenizers/$TOK/* /tmp/m/$M/ && cp .gpu/configs/$M.json /tmp/m/$M/config.json
rm -rf /tmp/src && mkdir /tmp/src && cp -r $(ls -A | grep -vxE "\.vllm|\.git") /tmp/src/
(cd /tmp/src && PYTHONPATH=/tmp/site:/tmp/src setsid nohup timeout 1500 python3 -m atom_aot.build.cli --model /tmp/m/$M \
   --load-format dummy-at-load --max-model-len 4096 --cache-dir /tmp/atom-cache --out /tmp/art/$M \
   > $LOGS/build-$M.log 2>&1 < /dev/null & echo $! > /tmp/build-$M.pid)
at "build started"
timeout 200 python3 scripts/gpu/sample_package_check.py --out $OUT/sample-package.json > $LOGS/sample-package.log 2>&1
at "sample package rc=$?"; tail -2 $LOGS/sample-package.log | cut -c1-600
tr '\r' '\n' < $LOGS/build-$M.log | grep -v '^\s*$' | tail -2 | cut -c1-200; nvidia-smi --query-gpu=memory.used --format=csv
