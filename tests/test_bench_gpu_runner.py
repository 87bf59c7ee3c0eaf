"""The GPU benchmark runner (`python -m atom_aot.bench.gpu`) on the CPU: its scenario table, the commands a
dry run prints, the result file's name and fields, and the shared measuring code on a tiny artifact."""
from __future__ import annotations

import dataclasses
import datetime
import json
import sys

import pytest

from atom_aot.bench.gpu import result as results
from atom_aot.bench.gpu.__main__ import main
from atom_aot.bench.gpu.measure import offline
from atom_aot.bench.gpu.runner import Paths, Step, measure, run_dir
from atom_aot.bench.gpu.scenarios import (KINDS, SCENARIOS, WEIGHTS, Model, Workload, engine_kwargs_vllm, scenario,
                                          table)


def test_every_scenario_is_well_formed():
    for name, s in SCENARIOS.items():
        assert s.name == name and name.startswith(s.model.config), name
        assert s.model.weights in WEIGHTS and set(s.workload.kinds) <= set(KINDS), name
        flags = list(s.build_flags)
        tp = int(flags[flags.index("-tp") + 1]) if "-tp" in flags else 1
        assert s.gpus == tp == dict(s.vllm_kwargs).get("tensor_parallel_size", 1), name
        if "serving" in s.workload.kinds:
            assert (s.workload.request_rate is None) != (s.workload.max_concurrency is None), name
        if "sampled" in s.workload.kinds:
            assert dict(s.workload.sampling)["temperature"] > 0, name
        if dict(s.ours_kwargs).get("method"):
            assert "speculative_config" in dict(s.vllm_kwargs), name
    assert all(f"| {name} |" in table() for name in SCENARIOS)


def test_docs_rows_have_their_scenarios():
    needed = {"qwen3-0.6b-throughput", "qwen3-0.6b-sampled", "qwen3-0.6b-tpot", "qwen3-0.6b-cold-start",
              "llama-3.1-8b-throughput", "llama-3.1-8b-fp8-throughput-1000", "llama-3.1-8b-tp2", "llama-3.1-8b-tp4",
              "qwen3-30b-a3b-16l-ep2", "deepseek-v3-5l", "llama-3.1-8b-spec-ngram", "deepseek-v3-5l-spec-mtp",
              "qwen3-0.6b-serving-rate", "qwen3-0.6b-prefix-sharing"}
    assert needed <= set(SCENARIOS)
    assert scenario("llama-3.1-8b-fp8-throughput").build_flags == ("--quant", "fp8", "--kv-cache-dtype", "fp8")


@pytest.fixture
def assets(tmp_path):
    (tmp_path / "configs").mkdir()
    for name in ("qwen3-0.6b", "llama-3.1-8b"):
        (tmp_path / "configs" / f"{name}.json").write_text(json.dumps({"vocab_size": 1000}))
    for name in ("qwen3", "llama3"):
        (tmp_path / "tokenizers" / name).mkdir(parents=True)
        (tmp_path / "tokenizers" / name / "tokenizer.json").write_text("{}")
    return tmp_path


def dry_run(capsys, assets, tmp_path, *args) -> list[str]:
    code = main([*args, "--dry-run", "--assets", str(assets), "--work", str(tmp_path / "work"),
                 "--out", str(tmp_path)])
    assert code == 0
    return capsys.readouterr().out.strip().splitlines()


def test_dry_run_prints_both_engines_commands(capsys, assets, tmp_path):
    lines = dry_run(capsys, assets, tmp_path, "qwen3-0.6b-throughput")
    assert "make_random_model.py" in lines[0] and "--device cuda" in lines[0]
    assert "-m atom_aot.build.cli" in lines[1] and "--max-model-len 4096" in lines[1]
    ours, vllm = lines[2], lines[3]
    assert "atom_aot.bench.gpu.measure ours qwen3-0.6b-throughput" in ours and "--artifact" in ours
    assert "atom_aot.bench.gpu.measure vllm qwen3-0.6b-throughput" in vllm and "--artifact" not in vllm
    assert "VLLM_USE_FLASHINFER_SAMPLER=0" in vllm and "VLLM_USE_FLASHINFER_SAMPLER" not in ours
    day = datetime.date.today().isoformat()
    assert lines[4] == f"# result: {tmp_path}/DEVICE-qwen3-0.6b-throughput-{day}.json"


def test_dry_run_of_one_engine_and_build_flags(capsys, assets, tmp_path):
    lines = dry_run(capsys, assets, tmp_path, "llama-3.1-8b-tp2", "--engines", "ours")
    assert lines[0].startswith("# config + tokenizer folder")           # dummy weights: no weights written
    assert lines[1].endswith("-tp 2 --load-format dummy")
    assert len(lines) == 4 and "measure ours" in lines[2]
    lines = dry_run(capsys, assets, tmp_path, "llama-3.1-8b-fp8-throughput", "--engines", "vllm")
    assert len(lines) == 3 and "atom_aot.build.cli" not in "\n".join(lines)


def test_same_draws_give_vllm_a_checkpoint_of_the_draws_ours_makes_at_load(capsys, assets, tmp_path):
    (assets / "configs" / "deepseek-v3.json").write_text(json.dumps({"vocab_size": 1000}))
    lines = dry_run(capsys, assets, tmp_path, "deepseek-v3-5l")
    assert lines[0].startswith("# config + tokenizer folder") and lines[0].endswith("deepseek-v3-5l-same-draws (in the runner)")
    assert lines[1].endswith("--load-format dummy-at-load")
    assert "make_random_model.py" in lines[2] and "--device cuda" in lines[2] and lines[2].endswith("--hub-expert-names")
    checkpoint = lines[2].split("--out ")[1].split()[0]
    assert checkpoint.endswith("deepseek-v3-5l-same-draws-checkpoint")
    assert f"--model {checkpoint} " in lines[4] and "measure vllm" in lines[4]
    assert "measure ours" in lines[3] and f"--model {checkpoint} " not in lines[3]
    # the step_profile kind: each engine's decode step profiled after both measured, vLLM on the same checkpoint
    assert "scripts/profile_decode.py" in lines[5] and "--artifact" in lines[5] and "--batch 256" in lines[5]
    assert "vllm_decode_profile.py" in lines[6] and f"--model {checkpoint} " in lines[6]
    assert "--load-format auto" in lines[6] and "VLLM_USE_FLASHINFER_SAMPLER=0" in lines[6]
    assert "make_random_model.py" not in "\n".join(dry_run(capsys, assets, tmp_path, "deepseek-v3-5l", "--engines", "ours"))


def test_prepare_only_makes_the_folders_and_measures_nothing(capsys, assets, tmp_path):
    work = tmp_path / "work"
    assert main(["llama-3.1-8b-tp2", "--engines", "vllm", "--prepare-only", "--assets", str(assets), "--work",
                 str(work), "--out", str(tmp_path / "result.json")]) == 0
    assert json.loads((work / "models" / "llama-3.1-8b-dummy" / "config.json").read_text())["vocab_size"] == 1000
    assert "nothing measured (--prepare-only)" in capsys.readouterr().out
    assert not (tmp_path / "result.json").exists() and not (work / "runs").exists()


def test_refusals_are_one_line(capsys, assets, tmp_path):
    assert main(["no-such-scenario"]) == 2
    assert "no scenario named 'no-such-scenario'" in capsys.readouterr().err
    assert main(["qwen3-0.6b-tpot", "--engines", "ours,tgi", "--dry-run"]) == 2
    assert "--engines takes a comma list of ours, vllm" in capsys.readouterr().err
    assert main(["qwen3-0.6b-tpot", "--dry-run", "--assets", str(tmp_path / "none")]) == 2
    assert "no config qwen3-0.6b.json" in capsys.readouterr().err


def test_vllm_loads_the_checkpoint_of_same_draws_and_draws_dummy_weights_itself():
    """same-draws: vLLM must load the checkpoint of our draws (load_format "dummy" would draw its own, which route
    every token to about the same experts: not the model ours runs)."""
    assert "load_format" not in engine_kwargs_vllm(scenario("deepseek-v3-5l"))             # same-draws
    assert "load_format" not in engine_kwargs_vllm(scenario("deepseek-v3-5l-fp8"))         # random: a checkpoint
    assert "load_format" not in engine_kwargs_vllm(scenario("glm-4.5-air-12l"))            # same-draws
    assert engine_kwargs_vllm(scenario("qwen3-30b-a3b-16l-tp2"))["load_format"] == "dummy"  # dummy-at-load


def test_result_name_and_fields(tmp_path):
    s, day = scenario("qwen3-0.6b-throughput"), datetime.date(2026, 11, 28)
    assert results.file_name("NVIDIA H100 80GB HBM3", s, day) == "h100-qwen3-0.6b-throughput-2026-11-28.json"
    assert results.device_slug("NVIDIA H200", 2) == "h200x2"
    assert results.device_slug("Some Board 9", 1) == "some-board-9"
    engines = {"ours": {"device": "NVIDIA H100 80GB HBM3", "versions": {"torch": "2.11.0"},
                        "throughput": {"output_tok_s": 16285.0}, "tpot": {"tpot_s": 0.00135},
                        "prefill": {"seconds": 3.72}},
               "vllm": {"device": "NVIDIA H100 80GB HBM3", "versions": {"vllm": "0.24.0"},
                        "throughput": {"output_tok_s": 15613.0}, "tpot": {"tpot_s": 0.00235},
                        "prefill": {"seconds": 3.06}}}
    data = results.assemble(s, engines, {}, ["python", "-m", "atom_aot.bench.gpu", s.name], "abc123", day)
    path = results.write(data, tmp_path, s, day)
    assert path.name == "h100-qwen3-0.6b-throughput-2026-11-28.json"
    saved = json.loads(path.read_text())
    assert {"scenario", "device", "commit", "command", "versions", "settings", "engines", "ratios",
            "errors"} <= set(saved)
    assert saved["versions"] == {"ours": {"torch": "2.11.0"}, "vllm": {"vllm": "0.24.0"}}
    assert saved["ratios"]["throughput_output_tok_s"] == pytest.approx(16285 / 15613)
    assert saved["ratios"]["tpot_speedup"] == pytest.approx(2.35 / 1.35)
    assert saved["ratios"]["prefill_speedup"] == pytest.approx(3.06 / 3.72)
    assert saved["settings"]["scenario"]["build_flags"] == []


def test_a_failing_engine_is_recorded_with_its_log(tmp_path):
    s = scenario("qwen3-0.6b-tpot")
    paths = Paths(tmp_path, tmp_path / "work", None)
    fails = Step("measure ours", (sys.executable, "-c", "print('loading'); raise SystemExit(3)"))
    figures, error = measure(fails, "ours", s, paths)
    assert figures is None and "exit code 3" in error and "loading" in error
    out = run_dir(s, paths) / "vllm.json"
    writes = Step("measure vllm", (sys.executable, "-c", f"open({str(out)!r}, 'w').write('{{\"tpot\": 1}}')"))
    assert measure(writes, "vllm", s, paths) == ({"tpot": 1}, None)


def test_the_measuring_code_runs_our_engine(tiny_llama_dir, tiny_llama_eager_artifact):
    tiny = dataclasses.replace(
        scenario("qwen3-0.6b-throughput"), model=Model("tiny", "tiny", "tiny"), max_model_len=256,
        workload=Workload(("throughput", "prefill", "tpot", "sampled"), num_prompts=3, input_len=8, output_len=4,
                          decode_tokens=4, sampling=(("temperature", 0.8), ("top_p", 0.95))))
    got = offline("ours", tiny, tiny_llama_dir, tiny_llama_eager_artifact)
    assert got["throughput"]["output_tokens"] == 12 and got["throughput"]["output_tok_s"] > 0
    assert got["prefill"]["output_tokens"] == 3 and got["prefill"]["output_len"] == 1
    assert got["sampled"]["output_tokens"] == 12 and got["sampled"]["sampling"]["top_p"] == 0.95
    assert len(got["tpot"]["runs"]) == 3 and got["tpot"]["tpot_s"] == sorted(got["tpot"]["runs"])[1]
