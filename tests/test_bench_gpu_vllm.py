"""The vllm section of scripts/bench_gpu.py: vLLM runs in a process of its own (scripts/vllm_peer.py) on
the same prompts, and the JSON gets its figures and the ratios to ours. A fake `vllm` package (written
here, put on PYTHONPATH) stands in for vLLM, which this machine does not have."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import bench_gpu  # noqa: E402

FAKE_VLLM = '''
import json, os, time
__version__ = "0.0-fake"
SEEN = os.environ["FAKE_VLLM_LOG"]

class SamplingParams:
    def __init__(self, temperature, max_tokens, ignore_eos):
        assert temperature == 0 and ignore_eos
        self.max_tokens = max_tokens

class _Out:
    def __init__(self, n):
        self.token_ids = list(range(n))

class _Request:
    def __init__(self, n):
        self.outputs = [_Out(n)]

class LLM:
    def __init__(self, model, **kwargs):
        with open(SEEN, "a") as f:
            f.write(json.dumps({"init": kwargs, "model": model}) + "\\n")

    def generate(self, prompts, params, use_tqdm=True):
        with open(SEEN, "a") as f:
            f.write(json.dumps({"prompts": [p["prompt_token_ids"] for p in prompts]}) + "\\n")
        time.sleep(0.001 * params.max_tokens)
        return [_Request(params.max_tokens) for _ in prompts]
'''
FAKE_INPUTS = '''
def TokensPrompt(prompt_token_ids):
    return {"prompt_token_ids": prompt_token_ids}
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_VLLM)
    (package / "inputs.py").write_text(FAKE_INPUTS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(package.parent), str(SCRIPTS),
                                                      os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_VLLM_LOG", str(tmp_path / "seen.jsonl"))
    return tmp_path / "seen.jsonl"


def run_args(tmp_path: Path, *extra: str):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"vocab_size": 500}))
    return bench_gpu.parse_args(["--model-dir", str(model), "--name", "t", "--out", str(tmp_path / "out.json"),
                                 "--num-prompts", "3", "--input-len", "16", "--output-len", "5",
                                 "--decode-tokens", "4", *extra])


def test_vllm_runs_our_prompts_in_its_own_process_and_the_ratios_follow(tmp_path, fake_vllm):
    args = run_args(tmp_path, "--vllm-engine-kwargs", '{"quantization": "fp8"}')
    peer = bench_gpu.vllm_peer(args)
    assert peer["vllm"] == "0.0-fake" and peer["engine_kwargs"] == {"quantization": "fp8"}
    assert peer["throughput"]["output_tokens"] == 3 * 5 and peer["tpot"]["tpot_s"] > 0
    seen = [json.loads(line) for line in fake_vllm.read_text().splitlines()]
    assert seen[0]["init"] == {"max_model_len": 4096, "gpu_memory_utilization": 0.85, "max_num_seqs": 256,
                               "seed": 0, "quantization": "fp8"}
    batches = [s["prompts"] for s in seen[1:]]
    assert batches[-1] == bench_gpu.random_prompts(3, 16, 500, seed=4)         # the throughput prompts, ours
    assert batches[1] == bench_gpu.random_prompts(1, 128, 500, seed=3)         # the tpot prompt, ours
    done = {"vllm": peer, "throughput": {"output_tok_s": 2 * peer["throughput"]["output_tok_s"]},
            "tpot": {"ours_tpot_s": peer["tpot"]["tpot_s"] / 4}}
    ratios = bench_gpu.vllm_ratios(done)
    assert ratios["throughput_ours_over_vllm"] == pytest.approx(2.0)
    assert ratios["tpot_vllm_over_ours"] == pytest.approx(4.0)


def test_without_vllm_the_section_fails_and_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(SCRIPTS))
    with pytest.raises(RuntimeError, match="needs vLLM importable"):
        bench_gpu.vllm_peer(run_args(tmp_path))
