"""The offline profiler example writes a real trace, and `scripts/analyze_trace.py` reads it back:
the step counts and tokens it reports follow from the batch that was profiled."""
from __future__ import annotations

import gzip
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from atom_aot.examples import profile_offline

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "analyze_trace.py"
BS, IN, OUT = 2, 40, 4


def load_script():
    spec = importlib.util.spec_from_file_location("analyze_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module        # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trace(tiny_llama_eager_artifact, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("offline-profile")
    assert profile_offline.main(["--model", str(tiny_llama_eager_artifact), "--input-length", str(IN),
                                 "--output-length", str(OUT), "--bs", str(BS), "--torch-profiler-dir", str(out)]) == 0
    (path,) = out.glob("*.json.gz")
    return path


def table_row(markdown: str, first_cell: str) -> list[str]:
    line = next(l for l in markdown.splitlines() if l.startswith(f"| {first_cell} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_summary_of_a_real_trace(trace):
    summary = load_script().summarize(str(trace))
    prefill = table_row(summary, "prefill")
    decode = table_row(summary, "decode")
    assert prefill[1:2] == ["1"] and prefill[4] == str(BS * IN)           # one prefill step of both prompts
    assert decode[1] == str(OUT - 1) and decode[4] == str(BS * (OUT - 1))  # the first token came from prefill
    assert "`aten::mm`" in summary or "`aten::addmm`" in summary
    assert "`atom::paged_attention`" in summary
    layers = [table_row(summary, str(i)) for i in range(3)]                # the tiny model has 3 layers
    assert all(float(row[1]) > 0 and float(row[2]) > 0 and float(row[3]) > 0 for row in layers)


def test_cli_writes_markdown(trace, tmp_path):
    out = tmp_path / "summary.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(trace), "--top", "5", "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith("# Trace summary") and "## Per layer" in proc.stdout
    ops = out.read_text().split("### CPU ops by self time")[1].split("##")[0]
    assert len(re.findall(r"^\| `", ops, flags=re.M)) == 5


def test_self_times_exclude_children():
    analyze = load_script()
    ev = lambda name, ts, dur, tid=1: analyze.Event(name, "cpu_op", ts, dur, 1, tid, {})  # noqa: E731
    outer, inner, leaf, other = ev("outer", 0, 100), ev("inner", 10, 50), ev("leaf", 20, 10), ev("x", 5, 30, tid=2)
    own = analyze.self_times([leaf, outer, other, inner])
    assert [own[id(e)] for e in (outer, inner, leaf, other)] == [50, 40, 10, 30]


def test_trace_without_steps_still_summarizes(tmp_path):
    path = tmp_path / "server.json"
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 10, "pid": 1, "tid": 1}]
    path.write_text(json.dumps({"traceEvents": events}))
    summary = load_script().summarize(str(path))
    assert "No `prefill[...]`" in summary and "`aten::mm`" in summary and "No per-layer ranges" in summary


def test_more_records_shapes_and_stacks(tiny_llama_eager_artifact, tmp_path, monkeypatch):
    monkeypatch.setenv("ATOM_PROFILER_MORE", "1")
    assert profile_offline.main(["--model", str(tiny_llama_eager_artifact), "--input-length", "16",
                                 "--output-length", "2", "--bs", "1", "--random-input",
                                 "--torch-profiler-dir", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("*.json.gz")
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    assert any("Input Dims" in (e.get("args") or {}) for e in events)
    assert any(e.get("cat") == "python_function" for e in events)
