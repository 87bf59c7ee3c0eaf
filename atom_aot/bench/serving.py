"""`python -m atom_aot.bench.serving`: the online serving benchmark, with vLLM's
`benchmark_serving.py` flags, table and result-file field names, so its numbers line up with
runs of the peers' own tool.

Requests arrive all at once (`--request-rate inf`) or as a Poisson / gamma process
(`--burstiness`), at most `--max-concurrency` in flight; each is streamed and timed on the client.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from datetime import datetime

import numpy as np

from atom_aot.bench import datasets
from atom_aot.bench.metrics import METRICS, format_table, parse_goodput, summarize
from atom_aot.bench.request import RequestInput, RequestOutput, make_client, make_stream_session, send_request

# ATOM's benchmark sends these backends' requests with its OpenAI completions code, so this one does too
BACKENDS = {"vllm": "/v1/completions", "openai": "/v1/completions", "lmdeploy": "/v1/completions",
            "scalellm": "/v1/completions", "sglang": "/v1/completions", "openai-chat": "/v1/chat/completions"}
# ATOM's other backends, each with its own protocol that this benchmark does not speak
OTHER_PROTOCOLS = {"tgi": "TGI's /generate_stream", "tensorrt-llm": "Triton's generate_stream",
                   "deepspeed-mii": "DeepSpeed-MII's non-streaming /mii"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atom_aot.bench.serving",
                                description="Benchmark online serving latency and throughput.")
    p.add_argument("--backend", default="vllm", help=f"one of {', '.join(sorted(BACKENDS))} (all but openai-chat "
                   "send /v1/completions requests)")
    p.add_argument("--base-url", default=None, help="server URL, e.g. http://127.0.0.1:8000 (else --host/--port)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default=None, help="default: /v1/completions (/v1/chat/completions for openai-chat)")
    p.add_argument("--model", default=None, help="the model name to send (default: the server's, from /v1/models)")
    p.add_argument("--served-model-name", default=None, help="send this name instead of --model")
    p.add_argument("--tokenizer", default=None, help="artifact, HF folder or GGUF (tokenizer.json beside it); "
                   "default: --model")
    _add_dataset_args(p)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps; 1 = Poisson")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--use-chat-template", action="store_true", help="wrap prompts in the chat template "
                   "(completions backends)")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl", help="any of ttft,tpot,itl,e2el")
    p.add_argument("--metric-percentiles", default="99", help="e.g. 25,50,75,99")
    p.add_argument("--goodput", nargs="+", default=None, metavar="METRIC:MS", help="SLOs, e.g. ttft:500 tpot:50")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--result-dir", default=None)
    p.add_argument("--result-filename", default=None)
    p.add_argument("--metadata", nargs="*", default=None, metavar="KEY=VALUE", help="added to the result file")
    p.add_argument("--profile", action="store_true", help="POST /start_profile and /stop_profile around the run")
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    _check_backend(p, args.backend)
    if args.random_range_ratio is None:
        args.random_range_ratio = 1.0 if args.random_range_mode == "atom" else 0.0
    try:
        datasets.length_bounds(args.random_input_len, args.random_range_ratio, args.random_range_mode)
    except ValueError as e:
        p.error(str(e))
    if args.burstiness <= 0:
        p.error("--burstiness must be > 0")
    try:
        parse_goodput(args.goodput)
    except ValueError as e:
        p.error(str(e))
    unknown = set(args.percentile_metrics.split(",")) - set(METRICS)
    if unknown:
        p.error(f"--percentile-metrics: unknown {', '.join(sorted(unknown))} (choose from {', '.join(METRICS)})")
    return args


def _check_backend(p: argparse.ArgumentParser, backend: str) -> None:
    if backend in OTHER_PROTOCOLS:
        p.error(f"--backend {backend}: its requests use {OTHER_PROTOCOLS[backend]} protocol, which this benchmark "
                f"does not implement; atom-aot serves the OpenAI API, so use --backend vllm (or openai-chat)")
    if backend not in BACKENDS:
        p.error(f"--backend {backend!r} is unknown; choose from {', '.join(sorted(BACKENDS))}")


def _add_dataset_args(p: argparse.ArgumentParser) -> None:
    d = p.add_argument_group("dataset")
    d.add_argument("--dataset-name", default="random", choices=("random", "sharegpt", "sonnet", "burstgpt"))
    d.add_argument("--dataset-path", default=None, help="ShareGPT JSON, sonnet text or BurstGPT CSV file")
    d.add_argument("--random-input-len", type=int, default=1024)
    d.add_argument("--random-output-len", type=int, default=128)
    d.add_argument("--random-range-ratio", type=float, default=None, help="atom mode (default): lengths drawn "
                   "from [r*len, len], default 1.0 = fixed; vllm mode: from [len*(1-r), len*(1+r)], default 0")
    d.add_argument("--random-range-mode", default="atom", choices=datasets.RANGE_MODES,
                   help="atom: ATOM's (and vLLM's older) meaning of --random-range-ratio; vllm: vLLM's newer one")
    d.add_argument("--random-prefix-len", type=int, default=0)
    d.add_argument("--sharegpt-output-len", type=int, default=None)
    d.add_argument("--sonnet-input-len", type=int, default=550)
    d.add_argument("--sonnet-output-len", type=int, default=150)
    d.add_argument("--sonnet-prefix-len", type=int, default=200)


def sample_requests(args, tokenizer) -> list[datasets.SampleRequest]:
    if args.dataset_name != "random" and not args.dataset_path:
        raise ValueError(f"--dataset-name {args.dataset_name} needs --dataset-path")
    if args.dataset_name == "sharegpt":
        return datasets.sample_sharegpt(tokenizer, args.dataset_path, args.num_prompts, args.sharegpt_output_len,
                                        args.seed)
    if args.dataset_name == "burstgpt":
        return datasets.sample_burstgpt(tokenizer, args.dataset_path, args.num_prompts, args.seed)
    if args.dataset_name == "sonnet":
        return datasets.sample_sonnet(tokenizer, args.dataset_path, args.num_prompts, args.sonnet_input_len,
                                      args.sonnet_output_len, args.sonnet_prefix_len,
                                      chat_formatted=args.backend != "openai-chat", seed=args.seed)
    requests = datasets.sample_random(tokenizer, args.num_prompts, args.random_input_len, args.random_output_len,
                                      args.random_range_ratio, args.random_prefix_len, args.seed,
                                      args.random_range_mode)
    if args.use_chat_template and args.backend != "openai-chat":
        requests = [_templated(tokenizer, r) for r in requests]
    return requests


def _templated(tokenizer, request: datasets.SampleRequest) -> datasets.SampleRequest:
    from atom_aot.bench.tokenizer import count_tokens
    prompt = datasets.chat_wrap(tokenizer, request.prompt)
    return datasets.SampleRequest(prompt, count_tokens(tokenizer, prompt), request.expected_output_len)


async def arrivals(requests: list, rate: float, burstiness: float, seed: int):
    """Yield requests at `rate` per second with gamma(burstiness) gaps (exponential at 1)."""
    rng = np.random.default_rng(seed)
    for i, request in enumerate(requests):
        yield request
        if rate != float("inf") and i + 1 < len(requests):
            await asyncio.sleep(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)))


async def run(args, requests: list[datasets.SampleRequest], base_url: str, api_url: str, model: str,
              tokenizer=None) -> dict:
    """The benchmark proper: a check request (also a warm-up), optional profiling around the timed
    run, and its summary."""
    chat = args.backend == "openai-chat"
    inputs = [RequestInput(r.prompt, api_url, r.prompt_len, r.expected_output_len, model, args.ignore_eos, chat)
              for r in requests]
    async with make_client() as client, make_stream_session() as session:
        test = await send_request(session, inputs[0])
        if not test.success:
            raise RuntimeError(f"the first request failed, check the flags: {test.error}")
        print("Initial test run completed. Starting main benchmark run...")
        if args.profile:
            await _post(client, base_url + "/start_profile")
        print(f"Traffic request rate: {args.request_rate}\nBurstiness factor: {args.burstiness} "
              f"({'Poisson process' if args.burstiness == 1 else 'Gamma distribution'})\n"
              f"Maximum request concurrency: {args.max_concurrency}")
        outputs, duration = await timed_run(session, inputs, args)
        if args.profile:
            await _post(client, base_url + "/stop_profile")
    return summarize(outputs, duration, _percentiles(args), parse_goodput(args.goodput), tokenizer)


async def timed_run(session, inputs: list[RequestInput], args) -> tuple[list[RequestOutput], float]:
    """Send every request on its arrival schedule, at most --max-concurrency in flight; returns
    the outputs in request order and the wall time from the first arrival to the last answer."""
    from tqdm import tqdm
    bar = None if args.disable_tqdm else tqdm(total=len(inputs))
    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else contextlib.nullcontext()

    async def one(request_input: RequestInput) -> RequestOutput:
        async with limit:
            out = await send_request(session, request_input)
        if bar is not None:
            bar.update(1)
        return out

    start = time.perf_counter()
    tasks = [asyncio.create_task(one(r)) async for r in arrivals(inputs, args.request_rate, args.burstiness,
                                                               args.seed)]
    outputs = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    if bar is not None:
        bar.close()
    return outputs, duration


async def _post(client, url: str) -> None:
    response = await client.post(url)
    if response.status_code != 200:
        raise RuntimeError(f"POST {url} failed ({response.status_code}): {response.text} "
                           f"(start the server with --torch-profiler-dir DIR)")
    print(f"{url.rsplit('/', 1)[-1]}: {response.json()}")


def _percentiles(args) -> list[float]:
    return [float(p) for p in args.metric_percentiles.split(",")]


def server_urls(args) -> tuple[str, str]:
    base = (args.base_url or f"http://{args.host}:{args.port}").rstrip("/")
    return base, base + (args.endpoint or BACKENDS[args.backend])


def served_model(base_url: str) -> str:
    import httpx
    from atom_aot.bench.request import auth_headers
    response = httpx.get(f"{base_url}/v1/models", headers=auth_headers(), timeout=30)
    if response.status_code != 200:
        raise RuntimeError(f"GET {base_url}/v1/models failed ({response.status_code}): {response.text}; "
                           f"pass --model (and OPENAI_API_KEY if the server wants a key)")
    return response.json()["data"][0]["id"]


def result_record(args, result: dict, model: str, tokenizer_id: str) -> dict:
    """What --save-result writes: the run's setup, then the results (vLLM's field names)."""
    record = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": args.backend, "model_id": model,
              "tokenizer_id": tokenizer_id, "num_prompts": args.num_prompts, "dataset_name": args.dataset_name}
    for item in args.metadata or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--metadata takes KEY=VALUE, got {item!r}")
        record[key.strip()] = value.strip()
    record.update(request_rate=args.request_rate if args.request_rate < float("inf") else "inf",
                  burstiness=args.burstiness, max_concurrency=args.max_concurrency)
    return {**record, **result}


def save_result(args, record: dict) -> str:
    name = args.result_filename
    if not name:
        concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
        model = record["model_id"].split("/")[-1]
        name = f"{args.backend}-{args.request_rate}qps{concurrency}-{model}-{record['date']}.json"
    path = os.path.join(args.result_dir, name) if args.result_dir else name
    if args.result_dir:
        os.makedirs(args.result_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f)
    return path


def main(argv=None) -> int:
    args = parse_args(argv)
    from atom_aot.bench.tokenizer import load_tokenizer
    base_url, api_url = server_urls(args)
    named = args.model if args.model and not os.path.exists(args.model) else None   # a path is a tokenizer
    model = args.served_model_name or named or served_model(base_url)
    tokenizer_id = args.tokenizer or args.model
    if tokenizer_id is None:
        raise SystemExit("error: pass --tokenizer (an artifact, a HF folder, or a GGUF with tokenizer.json beside it)")
    tokenizer = load_tokenizer(tokenizer_id)
    requests = sample_requests(args, tokenizer)
    result = asyncio.run(run(args, requests, base_url, api_url, model, tokenizer))
    print(format_table(result, args.percentile_metrics.split(","), _percentiles(args)))
    if args.save_result:
        print(f"saved {save_result(args, result_record(args, result, model, tokenizer_id))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
