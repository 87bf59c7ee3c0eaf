#!/usr/bin/env bash
# Session 35, nvidia-h200-x4 call G (carry .whl): greedy tokens of a tiny fp32 Llama (weights only, eager) at -tp 2
# and -tp 4 against -tp 1, all three engines one after another in one process (each closed before the next:
# the free GPU memory after each close is recorded), the all-reduce on peer memory.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 170 python3 scripts/gpu/tp_two_gpus.py tiny --tiny-models 1 --out $OUT/tiny-tp.json > $OUT/tiny.log 2>&1
echo "tiny rc=$? at $(( $(date +%s) - S )) s"; grep -E "all-reduce|rror|Trace" $OUT/tiny.log | sort | uniq -c | cut -c1-250
python3 -c "import json; d=json.load(open('$OUT/tiny-tp.json')); print(d.get('tiny_fp32_greedy'), d.get('error'), d.get('seconds'))" 2>&1 | cut -c1-900
