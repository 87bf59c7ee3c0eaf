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


def test_simple_inference_has_atoms_defaults():
    args = simple_inference.parse_args([])
    assert args.temperature == 0.6 and args.enable_thinking and args.torch_profiler_dir is None
    assert "如何在一个月内增肌10公斤" in simple_inference.PROMPTS
    assert simple_inference.parse_args(["--no-enable-thinking"]).enable_thinking is False


def test_enable_thinking_reaches_the_chat_template(tiny_llama_eager_artifact):
    from atom_aot import LLMEngine
    engine = LLMEngine(str(tiny_llama_eager_artifact), num_kv_blocks=64)
    engine.tokenizer.chat_template = "{{ 'think:' if enable_thinking else 'plain:' }}{{ messages[0]['content'] }}"
    assert simple_inference.chat_prompts(engine, ["q"], True) == ["think:q"]
    assert simple_inference.chat_prompts(engine, ["q"], False) == ["plain:q"]


def test_simple_inference_profiles_when_asked(tiny_llama_eager_artifact, tmp_path, capsys):
    assert simple_inference.main(["--model", str(tiny_llama_eager_artifact), "--max-tokens", "2",
                                  "--torch-profiler-dir", str(tmp_path), "Hi"]) == 0
    assert f"trace: {tmp_path / 'rank_0'}" in capsys.readouterr().out
    assert len(list((tmp_path / "rank_0").glob("*.json.gz"))) == 1
