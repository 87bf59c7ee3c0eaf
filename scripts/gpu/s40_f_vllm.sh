#!/usr/bin/env bash
# Session 40, calls F and G (F carries .vllm/bundle.part04: the last part; install vLLM 0.24.0). vLLM at
# tensor_parallel_size TP (F: 2 on GPUs 0,1; G: 4 on GPUs 0-3) through the shared harness on the same config +
# tokenizer folder as ours (its own random weights, load_format dummy): fresh-process starts with a cold then a warm
# compile cache (sbs runs them first), throughput 256 x 1024/512, batch-1 TPOT.
# Reused after session 40: MODEL names another folder under /tmp/m (default llama-3.1-8b), e.g. TP=2
# MODEL=qwen3-30b-a3b-16l (the 16-layer MoE that s41_a_builds.sh makes); GPUS picks the cards (default 0..TP-1);
# EXTRA adds engine kwargs (EXTRA=', "enable_expert_parallel": true') and NAME a suffix to the JSON's name.
uptime
LOGS=/tmp/s40; mkdir -p $LOGS /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ 2>/dev/null
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
[ -d /tmp/vsite/vllm ] || bash /tmp/vstage/install.sh > $LOGS/vllm-install.log 2>&1 || { tail -5 $LOGS/vllm-install.log; exit 1; }
at "vllm installed"
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
V="python3 /tmp/sbs.py vllm --model /tmp/m/${MODEL:-llama-3.1-8b} --vllm-cold-variants default_cold_compile_cache,default_warm_compile_cache"
CUDA_VISIBLE_DEVICES=${GPUS:-$(seq -s, 0 $(( TP - 1 )))} PYTHONPATH=/tmp/vsite timeout $(( ${LIMIT:-580} - ($(date +%s) - S) )) $V --out $OUT/sbs-vllm-${MODEL:-llama-3.1-8b}-tp$TP$NAME.json \
  --sections ${SECTIONS:-cold,throughput,tpot} --engine-kwargs '{"load_format": "dummy", "tensor_parallel_size": '$TP$EXTRA'}' > $LOGS/sbs-vllm-tp$TP.log 2>&1
at "vllm tp$TP rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" $LOGS/sbs-vllm-tp$TP.log | tail -8
grep -o "max_num_batched_tokens=[0-9]*" $LOGS/sbs-vllm-tp$TP.log | sort | uniq -c
tail -c 8000 $LOGS/sbs-vllm-tp$TP.log > $OUT/sbs-vllm-tp$TP$NAME.log.tail
uptime
