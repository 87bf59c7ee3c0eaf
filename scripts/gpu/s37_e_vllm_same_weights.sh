#!/usr/bin/env bash
# Session 37, call E (carry .vllm/bundle.part04, the last part): vLLM 0.24.0 on call D's random checkpoint (the
# weights our artifact draws), through the shared harness: throughput 256 x 1024/512 and batch-1 TPOT, then
# prefill only (1 output token) while the call has time.
mkdir -p /tmp/vstage /tmp/s37 && cp .vllm/bundle.part0* /tmp/vstage/ 2>/dev/null
[ -d /tmp/vsite/vllm ] || bash /tmp/vstage/install.sh > /tmp/s37/vllm-install.log 2>&1 || { tail -5 /tmp/s37/vllm-install.log; exit 1; }
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/vsite
S=$(date +%s); V="python3 /tmp/sbs.py vllm --model /tmp/m/ds5-256e-ckpt"
timeout 400 $V --out $OUT/sbs-vllm-ds5-256e-same-weights.json --sections throughput,tpot > /tmp/s37/vllm.log 2>&1
echo "vllm rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" /tmp/s37/vllm.log | tail -4
grep -E "Loading weights took|Available KV|GPU KV cache size|backend out of" /tmp/s37/vllm.log | cut -c1-250
timeout $(( 585 - ($(date +%s) - S) )) $V --out $OUT/sbs-vllm-ds5-256e-prefill-only.json --sections throughput --output-len 1 > /tmp/s37/vllm-prefill.log 2>&1
echo "vllm prefill rc=$? at $(( $(date +%s) - S )) s"; grep -E "\"seconds|init_s|rror" /tmp/s37/vllm-prefill.log | tail -3
tail -c 20000 /tmp/s37/vllm.log > $OUT/vllm.log.tail
