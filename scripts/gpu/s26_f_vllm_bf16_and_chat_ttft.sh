#!/usr/bin/env bash
# Session 26, GPU call F (carry .vllm/bundle.part05 .vllm/sbs.py): install vLLM 0.24; the same harness on the same
# Llama folder (bf16); then our server on the bf16 artifact measured by vLLM's `bench serve` chat client and by
# ours (issue 17: the two clients must report the same chat TTFT).
cp .vllm/bundle.part05 /tmp/vstage/ && bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -20 $OUT/vllm-install.log; exit 1; }
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
S=$(date +%s)
PYTHONPATH=/tmp/vsite timeout 300 python3 .vllm/sbs.py vllm --model /tmp/m/llama-3.1-8b --out $OUT/sbs-vllm-llama-3.1-8b.json --sections throughput,tpot 2>&1 | grep -E "tok_s|tpot_s\"|init_s|seconds|Error" | head -10
echo "vllm bf16 sbs at $(( $(date +%s) - S )) s"
OURS_PATH=/tmp/site:$PWD:/tmp/vsite
wait_up() { for i in $(seq 1 240); do curl -sf http://127.0.0.1:$1/v1/models >/dev/null && return 0; sleep 0.5; done; return 1; }
PYTHONPATH=$OURS_PATH python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama.atom serve --port 8000 \
  --gpu-memory-utilization 0.85 --max-num-seqs 256 > $OUT/ours-server.log 2>&1 &
OURS=$!
wait_up 8000 || { tail -30 $OUT/ours-server.log; exit 2; }
echo "ours up at $(( $(date +%s) - S )) s"
MODEL=$(curl -s http://127.0.0.1:8000/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
for round in 1 2; do
echo "== round $round: vllm bench serve (chat) against ours, model $MODEL"
PYTHONPATH=/tmp/vsite timeout 100 python3 /tmp/vsite/bin/vllm bench serve --backend openai-chat \
  --endpoint /v1/chat/completions --base-url http://127.0.0.1:8000 --model "$MODEL" --tokenizer /tmp/m/llama-3.1-8b \
  --dataset-name random --random-input-len 1024 --random-output-len 128 --num-prompts 200 --max-concurrency 64 \
  --ignore-eos --save-result --result-dir $OUT --result-filename vllmclient-chat-ours-c64-r$round.json 2>&1 | grep -E "TTFT|TPOT|throughput" | head -8
echo "== round $round: our client (chat) against ours"
PYTHONPATH=$OURS_PATH timeout 100 python3 -m atom_aot.bench.serving --base-url http://127.0.0.1:8000 --backend openai-chat \
  --tokenizer /tmp/m/llama-3.1-8b --dataset-name random --random-input-len 1024 --random-output-len 128 --random-range-ratio 1.0 \
  --num-prompts 200 --max-concurrency 64 --ignore-eos --disable-tqdm --save-result --result-dir $OUT \
  --result-filename ourclient-chat-ours-c64-r$round.json 2>&1 | grep -E "TTFT|TPOT|throughput" | head -8
done
kill -INT $OURS; wait $OURS
echo "call F total: $(( $(date +%s) - S )) s"
