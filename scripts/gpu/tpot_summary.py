"""One line per scripts/gpu/spec_tpot.py JSON: each mode's TPOT in ms and acceptance rate, per prompt.

  python scripts/gpu/tpot_summary.py FILE.json ...
"""
import json
import sys

for path in sys.argv[1:]:
    d = json.load(open(path))
    print(path.split("/")[-1], {mode: {prompt: (round(r["tpot_s"] * 1e3, 3), r.get("spec_stats_cumulative", {}).get("acceptance_rate"))
                                       for prompt, r in runs.items()} for mode, runs in d.items() if isinstance(runs, dict)})
