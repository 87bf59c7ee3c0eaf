"""The serving benchmark: its arithmetic on synthetic timings, its workloads, and a run against a
live server (tiny eager artifact) whose numbers must agree with each other and with the server's
own counts."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from test_server_support import API_KEY, ServerProcess, metric

from atom_aot.bench import datasets, serving
from atom_aot.bench.metrics import count_good, collect_samples, parse_goodput, summarize
from atom_aot.bench.request import RequestOutput
from atom_aot.bench.tokenizer import count_tokens, load_tokenizer


def output(ttft: float, latency: float, tokens: int, success: bool = True, itl=None) -> RequestOutput:
    return RequestOutput(success=success, prompt_len=10, output_tokens=tokens, ttft=ttft, latency=latency,
                         itl=itl or [], error="" if success else "boom")


# -- arithmetic on synthetic timings ------------------------------------------------------------
class TestGoodput:
    OUTPUTS = [output(0.1, 1.1, 11),     # tpot 0.1
               output(0.3, 0.8, 6),      # ttft too slow for a 200 ms SLO, tpot 0.1
               output(0.05, 2.05, 5),    # tpot 0.5
               output(0.02, 0.02, 1),    # one token: tpot counts as 0
               output(0.0, 0.0, 0, success=False)]

    def test_counts_requests_meeting_every_slo(self):
        samples = collect_samples(self.OUTPUTS, [o.output_tokens for o in self.OUTPUTS])
        assert count_good(samples, {"ttft": 200}) == 3
        assert count_good(samples, {"tpot": 150}) == 3
        assert count_good(samples, {"ttft": 200, "tpot": 150}) == 2
        assert count_good(samples, {"e2el": 1000}) == 2
        assert count_good(samples, {"ttft": 200, "tpot": 150, "e2el": 1000}) == 1

    def test_goodput_is_good_requests_per_second(self):
        result = summarize(self.OUTPUTS, duration_s=2.0, percentiles=[50, 99], slos_ms={"ttft": 200, "tpot": 150})
        assert result["request_goodput"] == pytest.approx(2 / 2.0)
        assert result["completed"] == 4 and result["request_throughput"] == pytest.approx(4 / 2.0)
        assert result["total_output_tokens"] == 23 and result["output_lens"][-1] == 0
        assert result["total_input_tokens"] == 40      # failed requests count no tokens
        assert summarize(self.OUTPUTS, 2.0, [99], {})["request_goodput"] is None

    def test_latency_statistics_in_ms(self):
        result = summarize(self.OUTPUTS, 2.0, [50, 99.9], {})
        tpots = np.array([0.1, 0.1, 0.5]) * 1000          # requests with more than one token
        assert result["mean_tpot_ms"] == pytest.approx(tpots.mean())
        assert result["median_tpot_ms"] == pytest.approx(100.0)
        assert result["std_tpot_ms"] == pytest.approx(tpots.std())
        assert result["p99.9_tpot_ms"] == pytest.approx(np.percentile(tpots, 99.9))
        assert result["mean_ttft_ms"] == pytest.approx(np.mean([100, 300, 50, 20]))
        assert result["median_e2el_ms"] == pytest.approx(np.median([1100, 800, 2050, 20]))

    @pytest.mark.parametrize("bad", [["ttft"], ["ttft:abc"], ["ttft:-1"], ["itl:5"], ["tpot:nan"]])
    def test_bad_slos_are_refused(self, bad):
        with pytest.raises(ValueError):
            parse_goodput(bad)

    def test_slos_parse(self):
        assert parse_goodput(["ttft:500", "tpot:50.5"]) == {"ttft": 500.0, "tpot": 50.5}


def test_arrivals_follow_the_rate_and_burstiness(monkeypatch):
    gaps = []

    async def fake_sleep(seconds):
        gaps.append(seconds)
    monkeypatch.setattr(asyncio, "sleep", fake_sleep)

    async def drain(rate, burstiness):
        return [r async for r in serving.arrivals(list(range(4001)), rate, burstiness, seed=0)]
    assert asyncio.run(drain(float("inf"), 1.0)) == list(range(4001)) and gaps == []
    asyncio.run(drain(20.0, 1.0))
    assert len(gaps) == 4000 and np.mean(gaps) == pytest.approx(1 / 20, rel=0.05)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, rel=0.1)       # exponential: CV 1
    gaps.clear()
    asyncio.run(drain(20.0, 4.0))
    assert np.mean(gaps) == pytest.approx(1 / 20, rel=0.05)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(0.5, rel=0.1)       # gamma(4): CV 1/sqrt(4)


# -- workloads ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(tiny_llama_eager_artifact):
    return load_tokenizer(str(tiny_llama_eager_artifact))


class TestDatasets:
    def test_random_prompts_have_the_lengths_they_report(self, tokenizer):
        requests = datasets.sample_random(tokenizer, 20, input_len=40, output_len=8, range_ratio=0.25,
                                          prefix_len=5, seed=3)
        assert all(r.prompt_len == count_tokens(tokenizer, r.prompt) for r in requests)
        assert sum(abs(r.prompt_len - 5 - 40) <= 10 + 2 for r in requests) == 20
        assert all(6 <= r.expected_output_len <= 10 for r in requests)
        assert len({r.prompt for r in requests}) == 20
        again = datasets.sample_random(tokenizer, 20, 40, 8, 0.25, 5, seed=3)
        assert again == requests

    def test_atom_range_ratio_draws_from_r_times_len_to_len(self, tokenizer):
        requests = datasets.sample_random(tokenizer, 30, input_len=40, output_len=8, range_ratio=0.5, seed=1,
                                          range_mode="atom")
        assert all(4 <= r.expected_output_len <= 8 for r in requests)
        assert len({r.expected_output_len for r in requests}) > 1
        fixed = datasets.sample_random(tokenizer, 10, 40, 8, 1.0, seed=1, range_mode="atom")
        assert {r.expected_output_len for r in fixed} == {8}

    @pytest.mark.parametrize("ratio, mode, bounds", [(0.5, "atom", (20, 40)), (1.0, "atom", (40, 40)),
                                                     (0.0, "atom", (1, 40)), (0.25, "vllm", (30, 50)),
                                                     (0.0, "vllm", (40, 40))])
    def test_length_bounds(self, ratio, mode, bounds):
        assert datasets.length_bounds(40, ratio, mode) == bounds

    @pytest.mark.parametrize("ratio, mode", [(1.0, "vllm"), (1.5, "atom"), (-0.1, "atom")])
    def test_ratios_outside_the_modes_range_are_refused(self, ratio, mode):
        with pytest.raises(ValueError, match="--random-range-ratio"):
            datasets.length_bounds(40, ratio, mode)

    def test_sharegpt_takes_first_turns_and_filters(self, tokenizer, tmp_path):
        convs = [{"conversations": [{"from": "human", "value": f"Tell me about item {i} and its history please"},
                                    {"from": "gpt", "value": "It is a fine item with a long story " * (i + 1)}]}
                 for i in range(6)]
        convs.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "short"}]})
        convs.append({"conversations": [{"from": "human", "value": "only one turn"}]})
        path = tmp_path / "sharegpt.json"
        path.write_text(json.dumps(convs))
        requests = datasets.sample_sharegpt(tokenizer, str(path), 6, seed=1)
        assert len(requests) == 6 and all(r.prompt.startswith("Tell me about item") for r in requests)
        assert all(r.expected_output_len >= 4 for r in requests)
        assert datasets.sample_sharegpt(tokenizer, str(path), 3, output_len=7)[0].expected_output_len == 7
        with pytest.raises(ValueError, match="usable conversations"):
            datasets.sample_sharegpt(tokenizer, str(path), 7)

    def test_sonnet_prompts_fit_the_input_length(self, tokenizer, tmp_path):
        path = tmp_path / "sonnet.txt"
        path.write_text("\n".join(f"Shall I compare thee to a summer's day number {i}?" for i in range(40)))
        requests = datasets.sample_sonnet(tokenizer, str(path), 4, input_len=220, output_len=9, prefix_len=80)
        assert len(requests) == 4 and all(r.prompt_len <= 220 and r.expected_output_len == 9 for r in requests)
        assert all("<|im_start|>user" in r.prompt and datasets.SONNET_BASE_PROMPT in r.prompt for r in requests)
        raw = datasets.sample_sonnet(tokenizer, str(path), 2, 220, 9, 80, chat_formatted=False)
        assert all(r.prompt.startswith(datasets.SONNET_BASE_PROMPT) for r in raw)

    def test_burstgpt_takes_gpt4_rows_with_a_response(self, tokenizer, tmp_path):
        path = tmp_path / "burstgpt.csv"
        rows = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
                "5,ChatGPT,400,50,450,Conversation log", "7,GPT-4,30,0,30,Conversation log",
                "9,GPT-4,24,11,35,Conversation log", "12,GPT-4,40,6,46,API log"]
        path.write_text("\n".join(rows))
        requests = datasets.sample_burstgpt(tokenizer, str(path), 5, seed=3)   # 2 usable rows: with replacement
        assert len(requests) == 5
        assert {(r.expected_output_len, abs(r.prompt_len - {11: 24, 6: 40}[r.expected_output_len]) <= 2)
                for r in requests} <= {(11, True), (6, True)}
        path.write_text("\n".join(rows[:3]))
        with pytest.raises(ValueError, match="no GPT-4 rows"):
            datasets.sample_burstgpt(tokenizer, str(path), 1)


# -- against a live server ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-profiles")


@pytest.fixture(scope="module")
def server(tiny_llama_eager_artifact, tmp_path_factory, profile_dir):
    with ServerProcess(tiny_llama_eager_artifact, tmp_path_factory.mktemp("bench-server"),
                       "--torch-profiler-dir", str(profile_dir)) as proc:
        yield proc


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)


def run_bench(server, artifact, tmp_path, *extra) -> dict:
    argv = ["--base-url", server.url, "--tokenizer", str(artifact), "--dataset-name", "random",
            "--random-input-len", "24", "--random-output-len", "6", "--num-prompts", "6", "--ignore-eos",
            "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--result-dir", str(tmp_path), "--result-filename", "result.json", *extra]
    assert serving.main(argv) == 0
    return json.loads((tmp_path / "result.json").read_text())


def test_completions_run_is_consistent_with_itself_and_the_server(server, tiny_llama_eager_artifact, tmp_path,
                                                                 api_key, capsys):
    import httpx
    generated_before = metric(httpx.get(f"{server.url}/metrics").text, "atom_generation_tokens_total")
    result = run_bench(server, tiny_llama_eager_artifact, tmp_path, "--request-rate", "50", "--max-concurrency", "3",
                       "--goodput", "ttft:60000", "e2el:60000", "--metadata", "note=ci")
    assert result["completed"] == result["num_prompts"] == 6 and not any(result["errors"])
    assert result["output_lens"] == [6] * 6 and result["total_output_tokens"] == 36
    assert result["server_prompt_tokens"] == result["input_lens"]        # what we sent is what it counted
    assert result["total_input_tokens"] == sum(result["input_lens"])
    for ttft, e2el, itl in zip(result["ttfts"], result["e2els"], result["itls"]):
        assert 0 < ttft <= e2el and len(itl) <= 5 and ttft + sum(itl) <= e2el
    assert result["mean_e2el_ms"] >= result["mean_ttft_ms"] and result["p99_e2el_ms"] >= result["median_e2el_ms"]
    assert result["output_throughput"] == pytest.approx(36 / result["duration"])
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])   # generous SLOs: all good
    assert result["backend"] == "vllm" and result["request_rate"] == 50.0 and result["note"] == "ci"
    generated_after = metric(httpx.get(f"{server.url}/metrics").text, "atom_generation_tokens_total")
    assert generated_after - generated_before == 36 + 6      # + the initial test request
    printed = capsys.readouterr().out
    assert "Serving Benchmark Result" in printed and "Mean E2EL (ms):" in printed and "P99 ITL (ms):" in printed


def test_chat_backend_counts_the_template_on_the_server(server, tiny_llama_eager_artifact, tmp_path, api_key):
    result = run_bench(server, tiny_llama_eager_artifact, tmp_path, "--backend", "openai-chat")
    assert result["completed"] == 6 and result["output_lens"] == [6] * 6
    assert all(s > i for s, i in zip(result["server_prompt_tokens"], result["input_lens"]))


def test_chat_template_on_completions(server, tiny_llama_eager_artifact, tmp_path, api_key):
    result = run_bench(server, tiny_llama_eager_artifact, tmp_path, "--use-chat-template")
    assert result["completed"] == 6
    assert result["server_prompt_tokens"] == result["input_lens"] and min(result["input_lens"]) > 24


def test_profile_brackets_the_run(server, tiny_llama_eager_artifact, tmp_path, api_key, profile_dir):
    run_bench(server, tiny_llama_eager_artifact, tmp_path, "--profile", "--num-prompts", "2")
    assert len(list((profile_dir / "rank_0").glob("*.json.gz"))) == 1


def test_failed_requests_are_reported_not_hidden(server, tiny_llama_eager_artifact, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "wrong-key")
    with pytest.raises(RuntimeError, match="401"):
        run_bench(server, tiny_llama_eager_artifact, tmp_path)


class TestFlags:
    def test_range_ratio_defaults_to_fixed_lengths_in_either_mode(self):
        assert serving.parse_args([]).random_range_ratio == 1.0
        vllm = serving.parse_args(["--random-range-mode", "vllm"])
        assert (vllm.random_range_mode, vllm.random_range_ratio) == ("vllm", 0.0)

    def test_range_ratio_out_of_range_is_refused(self, capsys):
        with pytest.raises(SystemExit):
            serving.parse_args(["--random-range-mode", "vllm", "--random-range-ratio", "1.0"])
        assert "[0, 1) with --random-range-mode vllm" in capsys.readouterr().err

    @pytest.mark.parametrize("backend", ["lmdeploy", "scalellm", "sglang", "openai", "vllm"])
    def test_atoms_completions_backends_send_completions(self, backend):
        assert serving.server_urls(serving.parse_args(["--backend", backend]))[1].endswith("/v1/completions")

    @pytest.mark.parametrize("backend, protocol", [("tgi", "generate_stream"), ("tensorrt-llm", "Triton"),
                                                   ("deepspeed-mii", "MII"), ("nope", "unknown")])
    def test_other_backends_are_refused_by_name(self, backend, protocol, capsys):
        with pytest.raises(SystemExit):
            serving.parse_args(["--backend", backend])
        err = capsys.readouterr().err
        assert backend in err and protocol in err
