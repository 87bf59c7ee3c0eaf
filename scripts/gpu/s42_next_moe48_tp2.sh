#!/usr/bin/env bash
# Planned since session 40 (renamed s42_next in session 41, still not run) (nvidia-h200-x4; carry .whl .gpu/configs .gpu/tokenizers/qwen3): the full
# 48-layer Qwen3-30B-A3B at -tp 2, whose compile does not fit one 10-minute call, with the MoE blocks' all-reduce in
# the fused norm (session 40, CPU-tested). `STEP=build` starts the build detached on GPU 2 (setsid: it outlives the
# call, as session 28's did) and returns; `STEP=run` waits for it, then our throughput + TPOT + starts on GPUs 2,3
# through the shared harness (vLLM at TP 2 beside it: TP=2 s40_f_vllm.sh with --model /tmp/m/qwen3-30b-a3b).
LOGS=/tmp/s41; source scripts/gpu/prelude.sh
M=/tmp/m/qwen3-30b-a3b ART=/tmp/art/qwen3-30b-a3b-tp2
if [ "${STEP:-build}" = build ]; then
  mkdir -p $M && cp .gpu/configs/qwen3-30b-a3b.json $M/config.json && cp .gpu/tokenizers/qwen3/* $M/
  rm -rf /tmp/src && cp -r $PWD /tmp/src
  (cd /tmp/src && CUDA_VISIBLE_DEVICES=2 PYTHONPATH=/tmp/site:/tmp/src setsid nohup python3 -m atom_aot.build.cli --model $M \
     --load-format dummy-at-load --max-model-len 4096 -tp 2 --cache-dir /tmp/atom-cache --out $ART > $LOGS/build-moe48.log 2>&1 \
     < /dev/null & echo $! > /tmp/build-moe48.pid)
  sleep 20; tail -2 $LOGS/build-moe48.log; exit 0
fi
S2=$(date +%s)
while kill -0 $(cat /tmp/build-moe48.pid) 2>/dev/null && [ $(( $(date +%s) - S2 )) -lt ${WAIT:-400} ]; do sleep 5; done
tr '\r' '\n' < $LOGS/build-moe48.log | grep -E "^stages|rror" | tail -2; [ -d $ART ] || exit 3
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=2,3
timeout $(( 580 - ($(date +%s) - S) )) python3 /tmp/sbs.py ours --model $M --artifact $ART --out $OUT/sbs-ours-moe48-tp2.json \
  --sections ${SECTIONS:-throughput,tpot,cold} > $LOGS/sbs-moe48.log 2>&1
at "moe48 tp2 rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|rror" $LOGS/sbs-moe48.log | tail -6
