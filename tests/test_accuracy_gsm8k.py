"""GSM8K scoring as lm-eval scores it, and the pipeline end to end on the tiny model: through a live
server and through transformers, the same prompts give the same greedy completions."""
from __future__ import annotations

import json

import pytest
from test_server_support import API_KEY, ServerProcess

from atom_aot.bench import gsm8k, gsm8k_task as task

COMPLETIONS = [" She has 3 + 4 = <<3+4=7>>7 apples.\n#### 7", " The cost is $1,250.\n#### 1,250.",
               " 12 - 5 = 7 so the answer is 7.", " Then 2.5 hours, or -3 degrees", "no number here",
               " #### -42", " 9 and then 10. #### 11\n#### 12"]


@pytest.mark.parametrize("text", COMPLETIONS)
def test_extraction_matches_lm_eval_filters(text):
    from lm_eval.filters import extraction          # lm-eval comes with the [test] extra
    strict = extraction.RegexFilter(regex_pattern=r"#### (\-?[0-9\.\,]+)")
    flexible = extraction.RegexFilter(regex_pattern=r"(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select=-1)
    assert task.extract_strict(text) == strict.apply([[text]], None)[0][0]
    assert task.extract_flexible(text) == flexible.apply([[text]], None)[0][0]


def test_scoring_normalizes_both_sides():
    problem = task.Problem("q", "Work: <<1000+250=1250>>.\n#### 1,250")
    assert problem.target == "1250"
    record = task.score(problem, " The cost is $1,250.\n#### 1,250.")
    assert record["strict_correct"] and record["flexible_correct"]
    record = task.score(problem, " It is 1250 then 7")
    assert not record["strict_correct"] and record["strict"] == task.INVALID and not record["flexible_correct"]
    assert task.accuracy([record, task.score(problem, "#### 1250")]) == {"n": 2, "strict-match": 0.5,
                                                                        "flexible-extract": 0.5}


def test_prompt_and_split():
    problems = [task.Problem(f"q{i}", f"a{i}\n#### {i}") for i in range(10)]
    shots, evaluated = task.split(problems, num_shots=3, limit=4)
    assert [s.question for s in shots] == ["q7", "q8", "q9"]
    assert [p.question for p in evaluated] == ["q0", "q1", "q2", "q3"]
    assert task.split(problems, 3, None)[1] == problems[:7]          # never the few-shot ones
    assert task.prompt(problems[0], shots[:2]) == ("Question: q7\nAnswer: a7\n#### 7\n\n"
                                                   "Question: q8\nAnswer: a8\n#### 8\n\nQuestion: q0\nAnswer:")
    assert task.cut_at_stop(" 5\n#### 5\n\nQuestion: next") == " 5\n#### 5"


# -- end to end on the tiny model -----------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tiny_llama_eager_artifact, tmp_path_factory):
    with ServerProcess(tiny_llama_eager_artifact, tmp_path_factory.mktemp("gsm8k-server")) as proc:
        yield proc


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("gsm8k") / "test.jsonl"
    rows = [{"question": f"Tom has {i} apples and buys {i + 2} more. How many now?",
             "answer": f"{i} + {i + 2} = <<{i}+{i + 2}={2 * i + 2}>>{2 * i + 2}\n#### {2 * i + 2}"} for i in range(6)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_server_and_hf_agree_on_the_same_prompts(server, data, tiny_llama_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    common = ["--data", str(data), "--num-shots", "2", "--limit", "3", "--max-tokens", "12"]
    assert gsm8k.main(["--base-url", server.url, "--output", str(tmp_path / "ours.json"), *common]) == 0
    assert gsm8k.main(["--backend", "hf", "--hf-model", str(tiny_llama_dir), "--output", str(tmp_path / "hf.json"),
                       *common]) == 0
    ours, hf = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("ours", "hf"))
    assert ours["n"] == hf["n"] == 3
    assert [r["completion"] for r in ours["records"]] == [r["completion"] for r in hf["records"]]
    assert all(r["target"] == str(2 * i + 2) for i, r in enumerate(ours["records"]))
    assert "strict-match" in capsys.readouterr().out
