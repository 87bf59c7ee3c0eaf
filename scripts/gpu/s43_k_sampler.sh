#!/usr/bin/env bash
# Session 43, a last machine (carry .whl .gpu/configs .gpu/tokenizers): the threshold kernel split over programs
# (float64 nucleus sums) on a GPU: its tests without the interpreter, the package end to end, its time against the
# sort, then Qwen3-0.6B's top-p throughput with it and with the sort (s43_j_sampling.sh).
LOGS=/tmp/s43; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_sampling_threshold.py > $LOGS/st2.log 2>&1
at "tests rc=$?"; tail -3 $LOGS/st2.log | cut -c1-400
timeout 150 python3 scripts/gpu/sample_package_check.py --out $OUT/sample-package2.json > $LOGS/sp2.log 2>&1
at "package rc=$?"; tail -1 $LOGS/sp2.log | cut -c1-300
timeout 150 python3 scripts/gpu/sampling_bench.py --out $OUT/sampling-bench2.json > $LOGS/sb2.log 2>&1
at "bench rc=$?"; python3 -c "
import json; d = json.load(open('$OUT/sampling-bench2.json'))
for r in d['rows']: print(r['vocab'], r['rows'], r['masks'][:12], r['equal'], r.get('rows_differing'),
    *(round(r[k], 3) for k in ('reference_threshold_ms', 'kernel_threshold_ms', 'reference_draw_ms', 'kernel_draw_ms')))" 2>&1 | tail -14
bash scripts/gpu/s43_j_sampling.sh
