#!/usr/bin/env bash
# Session 43, last call of a machine when time is left: Qwen3-0.6B (151,936-entry vocabulary) offline throughput
# greedy and with top-p 0.95 through the artifact's `sample` package, then top-p again on the same artifact with
# ATOM_SAMPLING_MASKS=sort (the whole-vocabulary sort it replaces): session 42's sampler lever for issue 15.
LOGS=/tmp/s43; source scripts/gpu/prelude.sh
Q=/tmp/m/qwen3-0.6b
[ -d $Q ] || python3 scripts/make_random_model.py --config .gpu/configs/qwen3-0.6b.json --tokenizer .gpu/tokenizers/qwen3 \
  --out $Q --device cuda > $LOGS/q06-make.log 2>&1 || tail -3 $LOGS/q06-make.log
B="python3 scripts/bench_gpu.py --model-dir $Q --name qwen3-0.6b --cache-dir /tmp/atom-cache"
timeout 400 $B --sections build,throughput,throughput_top_p --out $OUT/q06-sample-package.json > $LOGS/q06-kernel.log 2>&1
at "kernel rc=$?"; grep -E "masks|output_tok_s|FAILED" $LOGS/q06-kernel.log | tail -6 | cut -c1-300
ATOM_SAMPLING_MASKS=sort timeout $(( 590 - ($(date +%s) - S) )) $B --sections build,throughput_top_p \
  --out $OUT/q06-sort.json > $LOGS/q06-sort.log 2>&1
at "sort rc=$?"; grep -E "masks|output_tok_s|FAILED" $LOGS/q06-sort.log | tail -4 | cut -c1-300
python3 - <<'PY'
import json, os
o = os.environ["OUT"]
for f in ("q06-sample-package.json", "q06-sort.json"):
    try:
        d = json.load(open(f"{o}/{f}"))
    except Exception as e:
        print(f, e); continue
    print(f, {k: (v.get("output_tok_s") if isinstance(v, dict) else v) for k, v in d["sections"].items() if k.startswith("throughput")}, list(d["errors"]))
PY
