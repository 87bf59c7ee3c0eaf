#!/usr/bin/env bash
# Session 44, one H100, call A (carry .whl .gpu/configs .gpu/tokenizers .vllm/bundle.part05 .vllm/SHA256SUMS
# .vllm/install.sh .vllm/sbs.py): issue 15's Llama-3.1-8B gap. Starts the build detached (setsid: it outlives the
# call while calls B-E stage vLLM), random weights stored in the artifact (--load-format dummy, as sessions 29-30),
# whose capture-size probe now also measures the activation memory of the largest mixed step and of the sampler.
# ART names the artifact (default M) and BUILD_FLAGS adds build options (FP8: --quant fp8 --kv-cache-dtype fp8).
LOGS=/tmp/s44; source scripts/gpu/prelude.sh
M=${M:-llama-3.1-8b} TOK=${TOK:-llama3} ART=${ART:-${M:-llama-3.1-8b}}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; df -h /tmp | tail -1
mkdir -p /tmp/vstage /tmp/m/$M && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
cp .gpu/tokenizers/$TOK/* /tmp/m/$M/ && cp .gpu/configs/$M.json /tmp/m/$M/config.json
rm -rf /tmp/src && mkdir /tmp/src && cp -r $(ls -A | grep -vxE "\.vllm|\.git") /tmp/src/
(cd /tmp/src && PYTHONPATH=/tmp/site:/tmp/src setsid nohup timeout 1500 python3 -m atom_aot.build.cli --model /tmp/m/$M \
   --load-format ${LOAD:-dummy} --max-model-len 4096 --cache-dir /tmp/atom-cache --out /tmp/art/$ART $BUILD_FLAGS \
   > $LOGS/build-$M.log 2>&1 < /dev/null & echo $! > /tmp/build-$M.pid)
at "build started"; sleep 20
tr '\r' '\n' < $LOGS/build-$M.log | grep -v '^\s*$' | tail -3 | cut -c1-200; nvidia-smi --query-gpu=memory.used --format=csv
