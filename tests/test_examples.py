"""The example entry points run on the CPU and print what they promise."""
from __future__ import annotations

import re

from atom_aot.examples import simple_inference


def test_simple_inference_prints_answers_and_throughput(tiny_llama_eager_artifact, capsys):
    assert simple_inference.main(["--model", str(tiny_llama_eager_artifact), "--max-tokens", "6"]) == 0
    out = capsys.readouterr().out
    for question in simple_inference.PROMPTS:
        assert f"--- {question}" in out
    match = re.search(r"4 prompts, (\d+) tokens in [\d.]+s: ([\d.]+) tok/s \(eager\)", out)
    assert match and 4 <= int(match.group(1)) <= 24 and float(match.group(2)) > 0


def test_simple_inference_takes_prompts(tiny_llama_eager_artifact, capsys):
    assert simple_inference.main(["--model", str(tiny_llama_eager_artifact), "--max-tokens", "3", "Hello"]) == 0
    out = capsys.readouterr().out
    assert "--- Hello" in out and "1 prompts" in out
