#!/usr/bin/env bash
# Session 40, call E (carry .vllm/bundle.part03): stage vLLM part 3; where our Llama-3.1-8B -tp 2 batch-256 decode
# step goes (rank 0's GPU timeline: kernels grouped, idle gaps; the host parts), SLAB as the call B A/B chose.
LOGS=/tmp/s40; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1
ATOM_ALL_REDUCE_NORM_SLAB=${SLAB:-16384} timeout ${LIMIT:-200} python3 scripts/profile_decode.py --artifact /tmp/art/llama-tp2 --batch 256 --input-len 1024 \
  --sections step,kernels --out $OUT/profile-tp2-b256.json > $LOGS/profile.log 2>&1
at "profile rc=$?"; python3 -c "
import json; d = json.load(open('$OUT/profile-tp2-b256.json')); k = d.get('kernels', {})
print({key: k[key] for key in list(k)[:14]} if isinstance(k, dict) else k); print(d.get('step'))" 2>&1 | cut -c1-3000
tail -5 $LOGS/profile.log | cut -c1-300; ls /tmp/vstage | tr '\n' ' '
