"""scripts/trace_run.py on the CPU: the throughput workload traced step by step, and a KV pool too small for it
shows as preemptions and a tail, as a short pool of a Llama-3.1-8B run does on an H100."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import trace_run  # noqa: E402

WORKLOAD = ["--num-prompts", "12", "--input-len", "40", "--output-len", "20", "--max-num-seqs", "12", "--max-model-len", "256"]


def run(artifact, out: Path, *extra: str) -> dict:
    trace_run.main(["--artifact", str(artifact), "--out", str(out), *WORKLOAD, *extra])
    return json.loads(out.read_text())


def test_a_pool_that_holds_the_workload_runs_it_without_preemption(tiny_llama_eager_artifact, tmp_path):
    # a GPU's step budget, so the whole workload's prompts fit the first step as they do on a GPU
    result = run(tiny_llama_eager_artifact, tmp_path / "whole.json", "--num-kv-blocks", "256",
                 "--max-num-batched-tokens", "8192")
    summary = result["summary"]
    assert result["output_tokens"] == 12 * 20 and summary["preemptions"] == 0
    assert summary["steps"] == len(result["steps"]) and summary["prefill_steps"] >= 1
    walls = sum(step["wall_ms"] for step in result["steps"])
    assert abs(sum(summary["ms_by_phase"].values()) - walls) < 1e-6 and min(summary["ms_by_phase"].values()) > 0
    # the warm-up (sbs.py's: the first 4 prompts) left their two full blocks each in the prefix cache
    assert result["steps"][0]["launched_prefill"] and result["steps"][0]["launched_tokens"] == 12 * 40 - 4 * 32
    assert summary["tail"]["steps"] <= 2                 # every sequence ran to its last token together
    assert result["memory"]["kv_blocks_with_the_bound"] == 256     # no measurement on the CPU: the bound is used


def test_a_short_pool_preempts_and_ends_in_a_tail(tiny_llama_eager_artifact, tmp_path):
    # 12 sequences of 60 tokens need 12 x 4 blocks of 16; 36 blocks hold 9 of them to the end
    result = run(tiny_llama_eager_artifact, tmp_path / "short.json", "--num-kv-blocks", "36", "--gc-freeze")
    summary = result["summary"]
    assert result["output_tokens"] == 12 * 20
    assert summary["preemptions"] > 0 and summary["first_preemption_step"] is not None
    assert summary["tail"]["steps"] > 2 and summary["min_free_blocks"] == 0
