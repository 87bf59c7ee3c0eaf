#!/usr/bin/env bash
# Session 29, H100 call C (carry .whl .gpu .vllm/bundle.part05 .vllm/sbs.py; part00 is too big to go with .gpu):
# the Llama-3.1-8B random folder; its FP8 W8A8 + FP8 KV artifact (the decode attention now runs fp16 dots over
# the fp8 cache); our side of the FP8 side by side if time allows; then the Qwen3-30B-A3B-shaped MoE artifact
# (24 of its 48 layers, random weights drawn at build: --load-format dummy) starts detached and builds while
# the next calls stage vLLM (they do not touch the GPU).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage && cp .vllm/bundle.part05 /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; df -h /tmp /dev/shm; free -g; nproc; } > $OUT/machine.txt 2>&1
S=$(date +%s)
python3 scripts/make_random_model.py --config .gpu/configs/llama-3.1-8b.json --tokenizer .gpu/tokenizers/llama3 --out /tmp/m/llama-3.1-8b --device cuda >/dev/null || exit 2
M=/tmp/m/qwen3-30b-a3b-24l
mkdir -p $M /tmp/art /tmp/btmp && cp .gpu/tokenizers/qwen3/* $M/
python3 -c "import json; c=json.load(open('.gpu/configs/qwen3-30b-a3b.json')); c['num_hidden_layers']=24; c['max_window_layers']=24; json.dump(c, open('$M/config.json','w'), indent=1)"
echo "folders: $(( $(date +%s) - S )) s"
timeout 460 python3 -m atom_aot.build.cli --model /tmp/m/llama-3.1-8b --max-model-len 4096 --quant fp8 --kv-cache-dtype fp8 --out /tmp/art/llama-fp8.atom > $OUT/build-fp8.log 2>&1
echo "fp8 build rc=$? at $(( $(date +%s) - S )) s"
grep -v "it/s\]" $OUT/build-fp8.log | grep -E "stages|sizes|Error|error|attention" | tail -5
python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-fp8.atom inspect > $OUT/inspect-fp8.txt 2>&1; grep -E "phase|kv cache|attention" $OUT/inspect-fp8.txt | head -8
if [ $(( $(date +%s) - S )) -lt 400 ]; then
  timeout 150 python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-fp8.atom --out $OUT/sbs-ours-llama-3.1-8b-fp8.json --sections throughput,tpot > $OUT/sbs-ours-fp8.log 2>&1 && touch /tmp/ours-fp8-done
  echo "ours fp8 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s" $OUT/sbs-ours-fp8.log | tail -3
fi
df -h /tmp | tail -1
rm -rf /tmp/src && cp -r $PWD /tmp/src
(cd /tmp/src && TMPDIR=/tmp/btmp PYTHONPATH=/tmp/site:/tmp/src PYTHONUNBUFFERED=1 setsid nohup python3 -m atom_aot.build.cli \
   --model $M --load-format dummy --max-model-len 4096 --out /tmp/art/qwen3-moe-24l > /tmp/build-moe.log 2>&1 < /dev/null & echo $! > /tmp/build-moe.pid)
echo "moe build started at $(( $(date +%s) - S )) s"
