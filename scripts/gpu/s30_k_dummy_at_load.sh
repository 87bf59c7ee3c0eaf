#!/usr/bin/env bash
# Session 30, call K (fresh H100; carry .whl .gpu .vllm/sbs.py): --load-format dummy-at-load on a GPU: a Qwen3-0.6B build
# that stores no weights, then greedy tokens from the compiled packages and from --enforce-eager (the same drawn weights
# both times), the draw's time, and the shared harness's throughput and TPOT.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q=/tmp/m/qwen3-0.6b; mkdir -p $Q /tmp/art && cp .gpu/tokenizers/qwen3/* $Q/ && cp .gpu/configs/qwen3-0.6b.json $Q/config.json
S=$(date +%s)
timeout 420 python3 -m atom_aot.build.cli --model $Q --load-format dummy-at-load --max-model-len 4096 --out /tmp/art/q-dal > $OUT/build.log 2>&1
echo "build rc=$? at $(( $(date +%s) - S )) s"; tr '\r' '\n' < $OUT/build.log | grep -E "stages|rror" | tail -2; du -sh /tmp/art/q-dal /tmp/art/q-dal/weights
python3 -m atom_aot.entrypoints.run_cli /tmp/art/q-dal inspect > $OUT/inspect.txt 2>&1; grep -i "random\|drawn" $OUT/inspect.txt
timeout 120 python3 - > $OUT/greedy.log 2>&1 <<'PY'
import json, logging, os, subprocess, sys
logging.basicConfig(level=logging.INFO)
code = r'''
import json, sys, logging
logging.basicConfig(level=logging.INFO)
from atom_aot import LLMEngine, SamplingParams
e = LLMEngine("/tmp/art/q-dal", max_model_len=4096, gpu_memory_utilization=0.5, enforce_eager=sys.argv[1] == "1")
outs = e.generate([[1000 + i for i in range(n)] for n in (5, 37, 200)], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
print("TOKENS", json.dumps([o["token_ids"] for o in outs]))
print("TIMINGS", json.dumps({k: round(v, 3) for k, v in e.loaded.timings.items()}))
'''
res = {}
for eager in ("0", "1"):
    r = subprocess.run([sys.executable, "-c", code, eager], capture_output=True, text=True)
    print(r.stderr[-1500:])
    for line in r.stdout.splitlines():
        if line.startswith(("TOKENS", "TIMINGS")):
            res.setdefault(eager, {})[line.split()[0]] = json.loads(line.split(" ", 1)[1])
same = res["0"]["TOKENS"] == res["1"]["TOKENS"]
print("compiled == eager:", same, "timings:", res["0"]["TIMINGS"], res["1"]["TIMINGS"])
json.dump({"compiled_equals_eager": same, "runs": res}, open(os.environ["OUT"] + "/greedy.json", "w"), indent=1)
PY
echo "greedy rc=$?"; grep -E "compiled == eager|drawn at load|rror" $OUT/greedy.log | head
timeout $(( 585 - ($(date +%s) - S) )) python3 .vllm/sbs.py ours --model $Q --artifact /tmp/art/q-dal --out $OUT/sbs-ours-q-dal.json --sections throughput,tpot > $OUT/sbs.log 2>&1
echo "sbs rc=$?"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs.log | tail -3
