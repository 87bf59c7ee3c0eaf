"""What the sampler's whole-vocabulary masks cost on a GPU: the torch reference (a sort) against the threshold
kernel (atom_triton::sampling_threshold, what the artifact's `sample` package runs), and a whole draw each way:

  PYTHONPATH=. python scripts/gpu/sampling_bench.py --out $OUT/sampling.json

Rows 1 / 64 / 256 of Qwen3's 151,936-entry vocabulary and Llama-3's 128,256, logits drawn as a model's are (a few
tokens likely, a long tail), top-p 0.95 alone and with top-k 50 + min-p 0.05; thresholds compared first (`equal`,
and `rows_differing`: how many rows' thresholds differ, 0 when equal). Times: medians in ms of each call captured
in a CUDA graph and replayed (atom_aot/ops/triton/timing.py `measure_ms`): the GPU's time, not Python's cost of
launching the split kernel's 17 launches, which the artifact's compiled package does not pay either (a
first run of the split kernel timed those; `kernel_threshold_python_launch_ms` keeps that figure). The kernel is
JIT-compiled here (a bench, not the runtime).
"""
from __future__ import annotations

import argparse
import json

import torch


def main() -> None:
    import triton.testing
    from atom_aot.ops.sampling import mask_below, sampling_threshold
    from atom_aot.ops.triton.sampling_threshold import launch_sampling_threshold
    from atom_aot.ops.triton.timing import measure_ms
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = torch.device("cuda")
    report = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "rows": []}
    g = torch.Generator(device=device).manual_seed(0)
    for vocab in (151936, 128256):
        for n in (1, 64, 256):
            logits = torch.randn(n, vocab, device=device, generator=g) * 2.5        # a long tail, a few likely
            logits[:, :20] += 8 * torch.rand(n, 20, device=device, generator=g)
            for name, (k, p, m) in {"top_p 0.95": (0, 0.95, 0.0), "top_k 50 + top_p 0.95 + min_p 0.05": (50, 0.95, 0.05)
                                    }.items():
                params = (torch.full((n,), k, dtype=torch.int64, device=device), torch.full((n,), p, device=device),
                          torch.full((n,), m, device=device))
                want, got = sampling_threshold(logits, *params), launch_sampling_threshold(logits, *params)
                noise = torch.empty_like(logits).exponential_(generator=g)

                def draw(threshold):
                    return (mask_below(logits, threshold(logits, *params)).softmax(-1) / noise).argmax(-1)
                row = {"vocab": vocab, "rows": n, "masks": name, "equal": bool(torch.equal(want, got)),
                       "rows_differing": int((want != got).sum()),
                       "kept_mean": float((logits >= got.unsqueeze(-1)).sum(-1).float().mean()),
                       "reference_threshold_ms": measure_ms(lambda: sampling_threshold(logits, *params))[0],
                       "kernel_threshold_ms": measure_ms(lambda: launch_sampling_threshold(logits, *params))[0],
                       "kernel_threshold_python_launch_ms": triton.testing.do_bench(
                           lambda: launch_sampling_threshold(logits, *params)),
                       "reference_draw_ms": measure_ms(lambda: draw(sampling_threshold))[0],
                       "kernel_draw_ms": measure_ms(lambda: draw(launch_sampling_threshold))[0],
                       "greedy_argmax_ms": measure_ms(lambda: logits.argmax(-1))[0]}
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
                with open(args.out, "w") as f:
                    json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
