#!/usr/bin/env bash
# Session 39, call F (carry .vllm/bundle.part04): the last vLLM part; install vLLM 0.24.0; through the shared harness
# vLLM at tensor_parallel_size 2 (GPUs 0,1) then 4 (GPUs 0-3): throughput 256 x 1024/512 and batch-1 TPOT on the same
# config + tokenizer folder as ours (its own random weights, load_format dummy). SECTIONS adds cold where time allows.
LOGS=/tmp/s39; mkdir -p $LOGS /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ 2>/dev/null
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
[ -d /tmp/vsite/vllm ] || bash /tmp/vstage/install.sh > $LOGS/vllm-install.log 2>&1 || { tail -5 $LOGS/vllm-install.log; exit 1; }
at "vllm installed"
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
for TP in 2 4; do
  V="python3 /tmp/sbs.py vllm --model /tmp/m/llama-3.1-8b --vllm-cold-variants default_cold_compile_cache,default_warm_compile_cache"
  LEFT=$(( 590 - ($(date +%s) - S) )); [ $TP = 2 ] && LEFT=$(( LEFT / 2 + 20 ))
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( TP - 1 ))) PYTHONPATH=/tmp/vsite timeout $LEFT $V --out $OUT/sbs-vllm-llama-tp$TP.json \
    --sections ${SECTIONS:-throughput,tpot} --engine-kwargs '{"load_format": "dummy", "tensor_parallel_size": '$TP'}' > $LOGS/sbs-vllm-tp$TP.log 2>&1
  at "vllm tp$TP rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" $LOGS/sbs-vllm-tp$TP.log | tail -6
  tail -c 8000 $LOGS/sbs-vllm-tp$TP.log > $OUT/sbs-vllm-tp$TP.log.tail
done
