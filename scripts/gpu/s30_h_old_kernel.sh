#!/usr/bin/env bash
# Session 30, call H: the same Llama-3.1-8B bf16 build with the attention kernels as they were before this session's
# unmasked-key-blocks change, then our sbs at 256 x 1024/512: A/B on one machine. Make the old file first (not kept in the
# repository): git show d19135e:atom_aot/ops/triton/attention_kernels.py > scripts/gpu/s30_old_attention_kernels.py
cp scripts/gpu/s30_old_attention_kernels.py atom_aot/ops/triton/attention_kernels.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s); M=/tmp/m/llama-3.1-8b
timeout 420 python3 -m atom_aot.build.cli --model $M --load-format dummy --max-model-len 4096 --out /tmp/art/llama-bf16-old > $OUT/build-bf16-old.log 2>&1
echo "build rc=$? at $(( $(date +%s) - S )) s"; tr '\r' '\n' < $OUT/build-bf16-old.log | grep -E "stages|rror" | tail -2
timeout $(( 570 - ($(date +%s) - S) )) python3 /tmp/sbs.py ours --model $M --artifact /tmp/art/llama-bf16-old --out $OUT/sbs-ours-llama-bf16-old-kernel.json --sections throughput > $OUT/sbs-old.log 2>&1
echo "ours bf16 old kernel rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|init_s|rror" $OUT/sbs-old.log | tail -3
