#!/usr/bin/env bash
# Session 35, nvidia-h100-x4 call F (carry .vllm/bundle.part05): install vLLM 0.24.0; vLLM at tensor_parallel_size 2
# (GPUs 0,1) on the same Llama-3.1-8B config folder with its own random weights (load_format dummy): cold start
# (cold, then warm compile cache), then throughput 256 x 1024/512 and batch-1 TPOT.
cp .vllm/bundle.part05 /tmp/vstage/
[ -d /tmp/vsite/vllm ] || bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -5 $OUT/vllm-install.log; exit 1; }
TP=${TP:-2}; GPUS=$(seq -s, 0 $(( TP - 1 )))      # TP=4 on GPUs 0-3 (a later session)
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=$GPUS
nvidia-smi --query-gpu=memory.used --format=csv,noheader | tr '\n' ' '; echo; S=$(date +%s)
MODEL=${MODEL:-llama-3.1-8b}      # MODEL=qwen3-30b-a3b EXTRA=', "enable_expert_parallel": true' for EP (s36_c)
PYTHONPATH=/tmp/vsite timeout $(( 570 - ($(date +%s) - S) )) python3 /tmp/sbs.py vllm --model /tmp/m/$MODEL \
  --out $OUT/sbs-vllm-$MODEL-tp$TP${EXTRA:+-ep}.json --sections ${SECTIONS:-cold,throughput,tpot} \
  --vllm-cold-variants ${VARIANTS:-default_cold_compile_cache,default_warm_compile_cache} \
  --engine-kwargs '{"load_format": "dummy", "tensor_parallel_size": '"$TP${EXTRA:-}"'}' > $OUT/sbs-vllm.log 2>&1
echo "vllm rc=$? at $(( $(date +%s) - S )) s"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-vllm.log | tail -8
