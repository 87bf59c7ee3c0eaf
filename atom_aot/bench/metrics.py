"""From per-request timings to the serving benchmark's numbers, named as vLLM names them.

TTFT, TPOT (excluding the first token), ITL and E2EL get mean / median / std / percentiles in
milliseconds; throughputs count completed requests only; goodput is completed requests per
second that meet every given SLO.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from atom_aot.bench.request import RequestOutput

METRICS = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
           "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class Samples:
    """Per-request values (seconds) of the completed requests, in request order."""
    ttfts: list[float]
    tpots: list[float]        # requests with more than one output token
    all_tpots: list[float]    # every completed request (0 for one token): what goodput checks
    itls: list[float]         # every gap of every request
    e2els: list[float]


def parse_goodput(pairs: list[str] | None) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds), checked."""
    slos = {}
    for pair in pairs or []:
        name, _, value = pair.partition(":")
        if name not in GOODPUT_METRICS:
            raise ValueError(f"--goodput metric must be one of {', '.join(GOODPUT_METRICS)}, got {name!r}")
        try:
            slos[name] = float(value)
        except ValueError:
            slos[name] = -1.0
        if not slos[name] >= 0:      # also refuses nan
            raise ValueError(f"--goodput takes METRIC:MILLISECONDS with a non-negative number, got {pair!r}")
    return slos


def output_lens(outputs: list[RequestOutput], tokenizer=None) -> list[int]:
    """Output tokens per request: the server's count; 0 for a failed request. Without a usage
    count, the generated text is re-tokenized (which may differ by a token or two)."""
    lens = []
    for out in outputs:
        if not out.success:
            lens.append(0)
        elif out.output_tokens is not None:
            lens.append(out.output_tokens)
        else:
            lens.append(len(tokenizer(out.generated_text, add_special_tokens=False).input_ids))
    return lens


def collect_samples(outputs: list[RequestOutput], lens: list[int]) -> Samples:
    s = Samples([], [], [], [], [])
    for out, n in zip(outputs, lens):
        if not out.success:
            continue
        tpot = (out.latency - out.ttft) / (n - 1) if n > 1 else 0.0
        if n > 1:
            s.tpots.append(tpot)
        s.all_tpots.append(tpot)
        s.itls.extend(out.itl)
        s.ttfts.append(out.ttft)
        s.e2els.append(out.latency)
    return s


def count_good(samples: Samples, slos_ms: dict[str, float]) -> int:
    """Requests whose every SLO metric is within its limit."""
    columns = {"ttft": samples.ttfts, "tpot": samples.all_tpots, "e2el": samples.e2els}
    names = [name for name in GOODPUT_METRICS if name in slos_ms]
    if not names:
        return 0
    rows = zip(*(columns[name] for name in names))
    return sum(all(value <= slos_ms[name] / 1000 for name, value in zip(names, row)) for row in rows)


def summarize(outputs: list[RequestOutput], duration_s: float, percentiles: list[float],
              slos_ms: dict[str, float], tokenizer=None) -> dict:
    """The result dict: vLLM's field names (`completed`, `request_throughput`, `mean_ttft_ms`,
    `p99_itl_ms`, ...) plus the per-request lists."""
    lens = output_lens(outputs, tokenizer)
    samples = collect_samples(outputs, lens)
    completed = sum(out.success for out in outputs)
    if completed == 0:
        warnings.warn("every request failed: check --base-url, --model and --endpoint", stacklevel=2)
    total_input = sum(out.prompt_len for out in outputs if out.success)
    total_output = sum(lens)
    result = {
        "duration": duration_s, "completed": completed,
        "total_input_tokens": total_input, "total_output_tokens": total_output,
        "request_throughput": completed / duration_s,
        "request_goodput": count_good(samples, slos_ms) / duration_s if slos_ms else None,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "input_lens": [out.prompt_len for out in outputs], "output_lens": lens,
        "ttfts": [out.ttft for out in outputs], "itls": [out.itl for out in outputs],
        "e2els": [out.latency for out in outputs],
        "server_prompt_tokens": [out.server_prompt_tokens for out in outputs],
        "generated_texts": [out.generated_text for out in outputs], "errors": [out.error for out in outputs],
    }
    for name, values in (("ttft", samples.ttfts), ("tpot", samples.tpots), ("itl", samples.itls),
                         ("e2el", samples.e2els)):
        result.update(stats_ms(name, values, percentiles))
    return result


def stats_ms(name: str, values: list[float], percentiles: list[float]) -> dict:
    """mean/median/std/p<P> of `values` (seconds) in ms, keyed as vLLM keys them; 0 when empty."""
    ms = np.asarray(values or [0.0]) * 1000
    stats = {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
             f"std_{name}_ms": float(ms.std())}
    for p in percentiles:
        stats[f"p{percentile_word(p)}_{name}_ms"] = float(np.percentile(ms, p))
    return stats


def percentile_word(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def format_table(result: dict, metrics: list[str], percentiles: list[float]) -> str:
    """The results table vLLM prints."""
    row = "{:<40} {:<10}".format
    num = lambda label, value: "{:<40} {:<10.2f}".format(label, value)  # noqa: E731
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
             row("Successful requests:", result["completed"]),
             num("Benchmark duration (s):", result["duration"]),
             row("Total input tokens:", result["total_input_tokens"]),
             row("Total generated tokens:", result["total_output_tokens"]),
             num("Request throughput (req/s):", result["request_throughput"])]
    if result.get("request_goodput") is not None:
        lines.append(num("Request goodput (req/s):", result["request_goodput"]))
    lines += [num("Output token throughput (tok/s):", result["output_throughput"]),
              num("Total Token throughput (tok/s):", result["total_token_throughput"])]
    for name in metrics:
        label = name.upper()
        lines.append("{s:{c}^{n}}".format(s=METRICS[name], n=50, c="-"))
        lines.append(num(f"Mean {label} (ms):", result[f"mean_{name}_ms"]))
        lines.append(num(f"Median {label} (ms):", result[f"median_{name}_ms"]))
        for p in percentiles:
            lines.append(num(f"P{percentile_word(p)} {label} (ms):", result[f"p{percentile_word(p)}_{name}_ms"]))
    lines.append("=" * 50)
    return "\n".join(lines)
