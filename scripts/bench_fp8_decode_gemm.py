"""FP8 GEMMs at decode sizes as a decode step runs them: many layers' distinct weights back to back in
one CUDA graph (each weight read from HBM, no launch gaps), so the time per call is the kernel's own
and comparable with the weight-bytes floor. Writes one JSON.

Per layer group of Llama-3.1-8B (qkv, o, gate_up, down) and token count M: bf16 F.linear (cuBLAS),
torch._scaled_mm row-wise (cuBLASLt, what the `aten` backend runs), and the small-M kernel
(atom_aot/ops/triton/small_m_gemm.py) with each config, on activations quantized beforehand (the
quantization is fused into the preceding norm in a compiled model). Each fp8 path is checked against
the float32 reference on the same operands; --all-accumulations times the small-M kernel with each
place Hopper's reduced-precision fp8 sums reach fp32 (per instruction, per K step, only at the end:
Triton's default on sm90).

    PYTHONPATH=. python scripts/bench_fp8_decode_gemm.py --out $OUT/fp8-decode-gemm.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from atom_aot.ops.fp8 import fp8_linear_reference, quantize_activations, quantize_weight_per_channel

ACCUMULATIONS = {0: "", 1: "per-step-acc ", 2: "fast-acc "}    # key prefixes by the kernel's ACCUMULATION
LLAMA_8B = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
            "down_proj": (4096, 14336)}


def graph_us_per_call(calls, reps: int = 20) -> float:
    """Median over reps of one replay of a graph holding every call once, per call, in microseconds."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / len(calls))
    del graph
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--layers", type=int, default=16, help="distinct weights per group in one graph")
    p.add_argument("--tokens", default="1,2,4,8,16")
    p.add_argument("--configs", default="", help="';'-separated block_n,block_k,split_k,warps,stages "
                                                  "(default: the kernel's CANDIDATE_CONFIGS)")
    p.add_argument("--budget-s", type=float, default=400)
    p.add_argument("--all-accumulations", action="store_true",
                   help="time the small-M kernel with each ACCUMULATION (fp32 per instruction, per K step, fast)")
    args = p.parse_args()
    import atom_aot.ops.triton  # noqa: F401
    from atom_aot.ops.triton.small_m_gemm import CANDIDATE_CONFIGS, launch_small_m_gemm
    configs = ([tuple(map(int, c.split(","))) for c in args.configs.split(";") if c] if args.configs
               else list(CANDIDATE_CONFIGS))
    bandwidth = None
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = graph_us_per_call([lambda: dst.copy_(src)], reps=10)
    bandwidth = 2 * src.numel() / (copy_us * 1e-6) / 1e12             # TB/s, read + write
    del src, dst
    rows, deadline = [], time.time() + args.budget_s
    for group, (n, k) in LLAMA_8B.items():
        ws = [torch.randn(n, k, device="cuda") / k ** 0.5 for _ in range(args.layers)]
        q = [quantize_weight_per_channel(w) for w in ws]
        bf = [w.bfloat16() for w in ws]
        del ws
        for m in map(int, args.tokens.split(",")):
            if time.time() > deadline:
                rows.append({"group": group, "m": m, "skipped": "past the budget"})
                continue
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            xq, xs = quantize_activations(x, None, block_scaled=False)
            ref = fp8_linear_reference(x.float(), q[0][0], q[0][1], None, None)
            floor_us = n * k / (bandwidth * 1e12) * 1e6
            row = {"group": group, "m": m, "n": n, "k": k, "fp8_weight_floor_us": floor_us,
                   "bf16_us": graph_us_per_call([lambda w=w: torch.nn.functional.linear(x, w) for w in bf])}
            row["scaled_mm_us"] = graph_us_per_call([
                lambda w=w, s=s: torch._scaled_mm(xq, w.t(), scale_a=xs, scale_b=s[None, :], out_dtype=torch.bfloat16)
                for w, s in q])
            out = torch._scaled_mm(xq, q[0][0].t(), scale_a=xs, scale_b=q[0][1][None, :], out_dtype=torch.float32)
            row["scaled_mm_rel_error"] = ((out - ref).norm() / ref.norm()).item()
            for cfg, acc in itertools.product(configs, (0, 1, 2) if args.all_accumulations else (0,)):
                key = f"small_m {ACCUMULATIONS[acc]}" + ",".join(map(str, cfg))
                try:
                    out = launch_small_m_gemm(xq, xs, q[0][0], q[0][1], None, torch.float32, *cfg, accumulation=acc)
                    row[key + " rel_error"] = ((out - ref).norm() / ref.norm()).item()
                    row[key + " us"] = graph_us_per_call([
                        lambda w=w, s=s: launch_small_m_gemm(xq, xs, w, s, None, torch.bfloat16, *cfg, accumulation=acc)
                        for w, s in q])
                except Exception as e:  # noqa: BLE001  (a config that does not fit is recorded)
                    row[key + " error"] = repr(e)[:300]
            times = {k_[:-3]: v for k_, v in row.items() if k_.endswith("_us") or k_.endswith(" us")}
            times.pop("fp8_weight_floor", None)
            best = min(times, key=times.get)
            row["fastest"], row["fastest_share_of_floor"] = best, floor_us / times[best]
            rows.append(row)
            print(group, m, best, f"{times[best]:.1f} us (floor {floor_us:.1f}) scaled_mm {row['scaled_mm_us']:.1f}",
                  flush=True)
            args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                            "copy_bandwidth_tb_s": bandwidth, "layers_per_graph": args.layers,
                                            "rows": rows}, indent=1) + "\n")
        del q, bf
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
