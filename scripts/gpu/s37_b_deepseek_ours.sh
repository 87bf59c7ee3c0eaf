#!/usr/bin/env bash
# Session 37, call B (carry .vllm/bundle.part00): stage vLLM part 0. Builds call A's time cut short resume first.
# ds5-32e-mtp: our logits and greedy tokens against transformers' (call A's reference), greedy with MTP speculation
# (k = 1, 3) against without, batch-1 TPOT with and without MTP. ds5-256e through the shared harness: cold start x3,
# throughput 256 x 1024/512, batch-1 TPOT; the startup breakdown of `atom-run generate`.
mkdir -p /tmp/vstage /tmp/s37 && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
B="python3 -m atom_aot.build.cli --max-model-len 4096 --cache-dir /tmp/atom-cache"
[ -d /tmp/art/ds5-256e ] || { timeout 300 $B --model /tmp/m/ds5-256e --load-format dummy-at-load --out /tmp/art/ds5-256e > /tmp/s37/build-256e-resumed.log 2>&1 & }
[ -d /tmp/art/ds5-32e-mtp ] || timeout 300 $B --model /tmp/m/ds5-32e-mtp --out /tmp/art/ds5-32e-mtp > /tmp/s37/build-32e-resumed.log 2>&1
wait; at "artifacts: $(ls /tmp/art | tr '\n' ' ')"
tr '\r' '\n' < /tmp/s37/build-32e-resumed.log 2>/dev/null | grep -E '^stages|rror' | tail -2 | cut -c1-400
D="python3 scripts/gpu/deepseek_gpu.py"; ART=/tmp/art/ds5-32e-mtp
timeout 150 $D compare --artifact $ART --ref /tmp/ref.json --out $OUT/ds5-32e-mtp-vs-transformers.json > /tmp/s37/compare.log 2>&1
at "compare rc=$?"; grep -A4 -E '"(ours_vs|transformers_bf16)' /tmp/s37/compare.log | grep -v prompts | tr -s ' \n' ' '; echo
grep -E "rror|MLA|mla|moe|decode steps" /tmp/s37/compare.log | sort | uniq -c | head -8 | cut -c1-300
R="python3 /tmp/sbs.py ours --model /tmp/m/ds5-256e --artifact /tmp/art/ds5-256e"
timeout 240 $R --out $OUT/sbs-ours-ds5-256e.json --sections cold,throughput,tpot > /tmp/s37/sbs-ours.log 2>&1
at "ours sbs rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" /tmp/s37/sbs-ours.log | tail -8
grep -E "KV cache|decode steps|weights drawn|MLA|fused" /tmp/s37/sbs-ours.log | sort | uniq -c | head -6 | cut -c1-300
timeout 90 $D mtp --artifact $ART --out $OUT/ds5-32e-mtp-speculation.json --k 1,3 > /tmp/s37/mtp.log 2>&1
at "mtp rc=$?"; grep -E "greedy_equal|acceptance_rate|mean_accepted|rror" /tmp/s37/mtp.log | head -8
timeout $(( 570 - ($(date +%s) - S) )) python3 scripts/gpu/spec_tpot.py --artifact $ART --vocab 128256 --modes baseline,mtp --k 1 --out $OUT/ds5-32e-mtp-spec-tpot.json > /tmp/s37/spec.log 2>&1
at "spec tpot rc=$?"; grep -E "tpot_s\"|rror" /tmp/s37/spec.log | head -6
timeout 60 python3 -m atom_aot.entrypoints.run_cli /tmp/art/ds5-256e generate "Hello" --max-tokens 4 > /tmp/s37/generate.log 2>&1
at "generate rc=$?"; grep -E "^startup|^path|KV cache" /tmp/s37/generate.log | cut -c1-400
cp /tmp/s37/sbs-ours.log $OUT/ 2>/dev/null
