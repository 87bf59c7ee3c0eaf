"""The documented `lm_eval --model local-completions` command works against our server, on local
tasks (no hub): a generate_until task and a multiple-choice (loglikelihood) task, whose scores must
equal transformers' log-probabilities on the same weights. lm-eval[api] comes with the [test] extra."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from test_server_support import API_KEY, ServerProcess

pytestmark = pytest.mark.slow          # a live server and an lm_eval run: ~75 s on 2 cores

DOCS = [{"question": "What is 2 + 2?", "answer": "4", "choices": ["4", "5"], "label": 0},
        {"question": "What color is the sky?", "answer": "blue", "choices": ["green", "blue"], "label": 1},
        {"question": "How many legs does a cat have?", "answer": "4", "choices": ["four", "three"], "label": 0}]
TASK = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
"""
GENERATE = """output_type: generate_until
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
"""
CHOICE = """output_type: multiple_choice
doc_to_choice: "{{choices}}"
doc_to_target: "{{label}}"
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm-eval-tasks")
    (root / "data.jsonl").write_text("\n".join(json.dumps(d) for d in DOCS) + "\n")
    for name, body in (("atom_local_gen", GENERATE), ("atom_local_mc", CHOICE)):
        (root / f"{name}.yaml").write_text(TASK.format(name=name, data=root / "data.jsonl") + body)
    return root


@pytest.fixture(scope="module")
def lm_eval_command() -> str:
    """The `lm_eval` beside this interpreter; its API models need lm-eval's [api] extra (tenacity)."""
    missing = [m for m in ("lm_eval", "tenacity") if importlib.util.find_spec(m) is None]
    exe = shutil.which("lm_eval", path=os.path.dirname(sys.executable)) or shutil.which("lm_eval")
    if missing or exe is None:
        pytest.fail(f"lm-eval[api] is not installed (missing: {', '.join(missing) or 'the lm_eval command'}); "
                    f"pip install -e '.[test]' brings it", pytrace=False)
    return exe


@pytest.fixture(scope="module")
def server(tiny_llama_eager_artifact, tmp_path_factory):
    with ServerProcess(tiny_llama_eager_artifact, tmp_path_factory.mktemp("lm-eval-server")) as proc:
        yield proc


def lm_eval(exe, server, tokenizer_dir, tasks, out, tokenized: bool) -> subprocess.CompletedProcess:
    import httpx
    name = httpx.get(f"{server.url}/v1/models", headers=server.headers).json()["data"][0]["id"]
    model_args = (f"model={name},base_url={server.url}/v1/completions,tokenizer={tokenizer_dir},"
                  f"tokenizer_backend=huggingface,tokenized_requests={tokenized},num_concurrent=2,max_retries=1")
    env = {**os.environ, "OPENAI_API_KEY": API_KEY, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([exe, "--model", "local-completions", "--model_args", model_args,
                           "--tasks", "atom_local_gen,atom_local_mc", "--include_path", str(tasks),
                           "--output_path", str(out), "--log_samples"],
                          capture_output=True, text=True, env=env, timeout=600)


def hf_loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    """log P(continuation | context), split into tokens as lm-eval splits it."""
    whole = tokenizer(context + continuation, add_special_tokens=False).input_ids
    n_ctx = len(tokenizer(context, add_special_tokens=False).input_ids)
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), dim=-1)
    return sum(logprobs[i - 1, whole[i]].item() for i in range(n_ctx, len(whole)))


def test_local_completions_scores_match_transformers(lm_eval_command, server, tasks, tiny_llama_dir, tmp_path):
    """The documented command (text prompts: tokenized_requests=False)."""
    proc = lm_eval(lm_eval_command, server, tiny_llama_dir, tasks, tmp_path, tokenized=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = tmp_path.rglob("results_*.json")
    scores = json.loads(results.read_text())["results"]
    assert "exact_match,none" in scores["atom_local_gen"] and "acc,none" in scores["atom_local_mc"]
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    (samples,) = tmp_path.rglob("samples_atom_local_mc_*.jsonl")
    for sample in map(json.loads, samples.read_text().splitlines()):
        for args, (ll, _) in zip(sample["arguments"].values(), sample["filtered_resps"]):
            assert float(ll) == pytest.approx(hf_loglikelihood(model, tokenizer, args["arg_0"], args["arg_1"]),
                                              abs=1e-3)
