"""`scripts/peer_hf.py` on the CPU with the tiny model: it runs the serving benchmark's workload
(same prompts for the same flags) and writes comparable throughput numbers."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from atom_aot.bench import hf_reference
from atom_aot.bench.serving import parse_args, sample_requests

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "peer_hf.py"


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("peer_hf", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_workload_is_the_serving_benchmarks(peer, tiny_llama_dir):
    flags = ["--num-prompts", "5", "--random-input-len", "30", "--random-output-len", "4", "--seed", "7"]
    tokenizer = hf_reference.load_tokenizer(str(tiny_llama_dir))
    ours = sample_requests(parse_args(flags), tokenizer)
    theirs = peer.workload(peer.parse_args(["--model", str(tiny_llama_dir), *flags]), tokenizer)
    assert theirs == [tokenizer(r.prompt).input_ids for r in ours]


def test_runs_on_cpu_and_compares(peer, tiny_llama_dir, tmp_path):
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps({"output_throughput": 100.0}))
    out = tmp_path / "peer.json"
    assert peer.main(["--model", str(tiny_llama_dir), "--device", "cpu", "--num-prompts", "5",
                      "--random-input-len", "16", "--random-output-len", "4", "--modes", "latency,batch",
                      "--latency-prompts", "2", "--batch-size", "2", "--no-compile", "--out", str(out),
                      "--compare", str(ours)]) == 0
    record = json.loads(out.read_text())
    latency, batch = record["results"]["latency"], record["results"]["batch"]
    assert latency["prompts"] == 2 and latency["decode_tok_s"] > 0 and latency["mean_ttft_ms"] > 0
    assert batch["output_tokens"] == 5 * 4 and batch["output_throughput"] > 0
    assert record["comparison"]["ratio_ours_over_peer"] == pytest.approx(100.0 / batch["output_throughput"])
    assert record["workload"] == {"num_prompts": 5, "input_len": 16, "output_len": 4, "range_ratio": 0.0, "seed": 0}
