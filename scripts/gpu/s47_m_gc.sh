#!/usr/bin/env bash
# Session 47, call M (carry .whl .gpu/configs .gpu/tokenizers/llama3): the engine's rarer full collections on a GPU,
# A/B on one artifact. Llama-3.1-8B's shapes cut to 2 layers (a build of minutes; host-bound steps, where a
# collector pause costs the most), FP8 W8A8 + FP8 KV, sbs.py's 1000 x 1000 / 1000 workload through trace_run.py:
# as shipped (generation-2 threshold 1000) and with the start's setting skipped (Python's default 10).
LOGS=/tmp/s47; source scripts/gpu/prelude.sh
M=/tmp/m/llama-2l A=/tmp/art/llama-2l-fp8
mkdir -p $M && cp .gpu/tokenizers/llama3/* $M/ && python3 -c "
import json; c=json.load(open('.gpu/configs/llama-3.1-8b.json')); c['num_hidden_layers']=2; json.dump(c, open('$M/config.json','w'))"
timeout 400 python3 -m atom_aot.build.cli --model $M --load-format dummy --max-model-len 4096 --cache-dir /tmp/atom-cache \
  --out $A --quant fp8 --kv-cache-dtype fp8 > $LOGS/build.log 2>&1; at "build rc=$?"
tr '\r' '\n' < $LOGS/build.log | grep -E "^stages|rror" | tail -2 | cut -c1-300
for mode in shipped python-default; do
  timeout 150 python3 -c "
import runpy, sys
import atom_aot.runtime.startup as st
if '$mode' == 'python-default':
    st.space_out_full_collections = lambda: None
sys.argv = ['trace_run.py', '--artifact', '$A', '--out', '$OUT/trace-2layer-$mode.json', '--num-prompts', '1000',
            '--input-len', '1000', '--output-len', '1000', '--label', '$mode']
runpy.run_path('scripts/trace_run.py', run_name='__main__')
" > $LOGS/trace-$mode.log 2>&1; at "$mode rc=$?"; tail -1 $LOGS/trace-$mode.log | cut -c1-200
  python3 -c "
import json; d=json.load(open('$OUT/trace-2layer-$mode.json')); s=d['summary']
print('$mode', round(d['output_tok_s']), 'tok/s', round(s['seconds'], 2), 's', 'gc count', s['gc']['count_by_generation'],
      'ms', {k: round(v) for k, v in s['gc']['ms_by_generation'].items()}, 'longest', [round(p[1], 1) for p in s['gc']['longest'][:3]])"
done
