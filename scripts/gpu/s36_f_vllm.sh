#!/usr/bin/env bash
# Session 36, multi-GPU calls F and G (F carries .vllm/bundle.part04: the last part; vLLM 0.24.0 installed once).
# vLLM at tensor_parallel_size 2 on GPUs 0,1, through the shared harness, on the same config + tokenizer folder as
# ours with its own random weights (load_format dummy). F: MODEL=llama-3.1-8b, cold (cold, then warm compile
# cache), throughput 256 x 1024/512, batch-1 TPOT. G: MODEL=qwen3-30b-a3b-16l the same, then EP=1 (expert parallel)
# throughput and TPOT while the call has time. TP=4 runs tensor_parallel_size 4 on GPUs 0-3 (session 37's plan).
mkdir -p /tmp/vstage /tmp/s36 && cp .vllm/bundle.part0* /tmp/vstage/ 2>/dev/null
[ -d /tmp/vsite/vllm ] || bash /tmp/vstage/install.sh > /tmp/s36/vllm-install.log 2>&1 || { tail -5 /tmp/s36/vllm-install.log; exit 1; }
TP=${TP:-2}
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( TP - 1 )))
nvidia-smi --query-gpu=memory.used --format=csv,noheader | tr '\n' ' '; echo; S=$(date +%s)
MODEL=${MODEL:-llama-3.1-8b}
V="python3 /tmp/sbs.py vllm --model /tmp/m/$MODEL --vllm-cold-variants default_cold_compile_cache,default_warm_compile_cache"
PYTHONPATH=/tmp/vsite timeout $(( ${FIRST_S:-560} - ($(date +%s) - S) )) $V --out $OUT/sbs-vllm-$MODEL-tp$TP.json \
  --sections ${SECTIONS:-cold,throughput,tpot} --engine-kwargs '{"load_format": "dummy", "tensor_parallel_size": '$TP'}' > /tmp/s36/sbs-vllm-$MODEL.log 2>&1
echo "vllm $MODEL rc=$? at $(( $(date +%s) - S )) s"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" /tmp/s36/sbs-vllm-$MODEL.log | tail -8
if [ "$EP" = 1 ]; then
  PYTHONPATH=/tmp/vsite timeout $(( 585 - ($(date +%s) - S) )) $V --out $OUT/sbs-vllm-$MODEL-ep2.json --sections throughput,tpot \
    --engine-kwargs '{"load_format": "dummy", "tensor_parallel_size": 2, "enable_expert_parallel": true}' > /tmp/s36/sbs-vllm-$MODEL-ep.log 2>&1
  echo "vllm $MODEL ep rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" /tmp/s36/sbs-vllm-$MODEL-ep.log | tail -5
fi
tail -c 20000 /tmp/s36/sbs-vllm-$MODEL.log > $OUT/sbs-vllm-$MODEL.log.tail
