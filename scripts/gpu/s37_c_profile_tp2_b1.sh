#!/usr/bin/env bash
# Planned for the next multi-GPU session, after s37_a (the -tp 2 artifact in /tmp/art): where our Llama-3.1-8B
# -tp 2 batch-1 decode step goes (session 36: 3.52 ms per token against vLLM's 3.44). Rank 0's GPU timeline per
# step: kernels grouped (GEMMs, attention, all-reduce: one-shot `symm_mem`/NCCL, the step's input broadcast and its
# pack kernels), the busy share and idle gaps; the host parts of a step. ATOM_ALL_REDUCE=nccl for the A/B.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0,1
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
P="python3 scripts/profile_decode.py --artifact /tmp/art/llama-tp2 --batch 1 --input-len 128 --sections step,kernels"
timeout 200 $P --out $OUT/profile-tp2-b1.json > /tmp/s36/profile-tp2-b1.log 2>&1; at "profile rc=$?"
ATOM_ALL_REDUCE=nccl timeout 200 $P --out $OUT/profile-tp2-b1-nccl.json > /tmp/s36/profile-tp2-b1-nccl.log 2>&1
at "profile (nccl) rc=$?"
python3 - <<PY
import json
for f in ("profile-tp2-b1.json", "profile-tp2-b1-nccl.json"):
    try:
        d = json.load(open("$OUT/" + f))
    except Exception as e:
        print(f, e); continue
    k = d.get("kernels", {})
    print(f, {key: k[key] for key in list(k)[:12]} if isinstance(k, dict) else k, d.get("step", {}).get("wall_ms"))
PY
