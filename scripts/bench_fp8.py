"""Time the FP8 W8A8 GEMM paths against bf16 on Llama-3.1-8B's linear shapes; every number goes to JSON.

    PYTHONPATH=. python scripts/bench_fp8.py --out $OUT/fp8-gemm.json          # H100/H200, ~3 min
    PYTHONPATH=. python scripts/bench_fp8.py --out /tmp/fp8.json --smoke       # CPU interpreter, tiny shapes

Per layer group (qkv, o, gate_up, down) and token count M (decode 1..256, prefill 512..8192):
- bf16: torch.nn.functional.linear (cuBLAS), the baseline;
- fp8 aten: atom::fp8_linear's CUDA path (dynamic per-token quantization + torch._scaled_mm row-wise),
  as separate kernels (what the build's tuning times); "aten compiled": the same through torch.compile
  (the quantization fused, as inside an AOTInductor package); "scaled_mm only": the GEMM alone;
- fp8 triton: atom_triton::fp8_linear with each candidate config (per-channel, and 128x128 blocks);
each checked against the float32 reference on the same FP8 operands (relative error), timed with
the build's measure_ms (CUDA-graph replay under do_bench, median). The winner per shape is what the
build's tuning would store.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from atom_aot.ops.fp8 import fp8_linear_reference, quantize_weight_blocks, quantize_weight_per_channel  # noqa: E402

LLAMA_8B = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
            "down_proj": (4096, 14336)}
SMOKE_SHAPES = {"qkv_proj": (384, 256), "down_proj": (256, 384)}
TOKENS = (1, 8, 32, 128, 256, 512, 2048, 8192)


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def timed(fn, smoke: bool) -> float | None:
    if smoke:
        fn()
        return None
    from atom_aot.ops.triton.timing import measure_ms
    return measure_ms(fn)[0]


_COMPILED = {}


def compiled_aten():
    """The aten path as an AOTInductor package holds it: quantization fused by Inductor, then _scaled_mm."""
    if "fn" not in _COMPILED:
        from atom_aot.ops.fp8 import fp8_linear_cublas
        _COMPILED["fn"] = torch.compile(fp8_linear_cublas, dynamic=True)
    return _COMPILED["fn"]


def scaled_mm_only(x, w, s):
    """_scaled_mm on activations quantized beforehand (outside the timing): the GEMM's own cost."""
    from atom_aot.ops.fp8 import quantize_activations
    key = ("q", x.data_ptr(), x.shape)
    if _COMPILED.get("q_key") != key:
        _COMPILED["q_key"], _COMPILED["q"] = key, quantize_activations(x, None, False)
    xq, xs = _COMPILED["q"]
    return torch._scaled_mm(xq, w.t(), scale_a=xs.contiguous(), scale_b=s[None, :], out_dtype=x.dtype)


EXTRA_CONFIGS: list = []     # --extra-configs: launch configs measured beside the build's candidates


def candidates(block: bool):
    from atom_aot.ops.triton.fp8_gemm import CANDIDATE_CONFIGS
    rows = [] if block else [("aten", lambda x, w, s: torch.ops.atom.fp8_linear(x, w, s, None, None)),
                             ("aten compiled", lambda x, w, s: compiled_aten()(x, w, s, None, None)),
                             ("scaled_mm only", scaled_mm_only)]
    for c in (*CANDIDATE_CONFIGS, *EXTRA_CONFIGS):
        rows.append((f"triton {','.join(map(str, c.as_args()))}",
                     lambda x, w, s, c=c: torch.ops.atom_triton.fp8_linear(x, w, s, None, None, *c.as_args())))
    return rows


def bench_shape(group: str, n: int, k: int, m: int, device: str, smoke: bool) -> dict:
    w = torch.randn(n, k, device=device) / k ** 0.5
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    w_bf16 = w.bfloat16()
    row = {"group": group, "m": m, "n": n, "k": k, "bf16_ms": timed(lambda: torch.nn.functional.linear(x, w_bf16), smoke)}
    for layout, quantize in (("channel", quantize_weight_per_channel), ("block", quantize_weight_blocks)):
        weight, scale = quantize(w)
        # once per layout, on the device (a CPU reference of an 8192 x 28672 x 4096 GEMM per candidate
        # took this script past its time limit on the H100)
        ref = fp8_linear_reference(x, weight, scale, None, None)
        for name, fn in candidates(layout == "block"):
            if smoke and name.startswith(("aten", "scaled_mm")):
                continue          # _scaled_mm needs a GPU
            key = f"fp8 {layout} {name}"
            try:
                out = fn(x, weight, scale)
                row[f"{key} rel_error"] = rel_error(out, ref)
                row[f"{key} ms"] = timed(lambda: fn(x, weight, scale), smoke)
            except Exception:  # noqa: BLE001  (one failing path is recorded; the rest still runs)
                row[f"{key} error"] = traceback.format_exc(limit=3)
    times = {k.removesuffix(" ms"): v for k, v in row.items() if k.endswith(" ms") and v is not None}
    if times:
        best = min(times, key=times.get)
        row["fastest"], row["speedup_vs_bf16"] = best, row["bf16_ms"] / times[best]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes in the Triton interpreter (no GPU)")
    parser.add_argument("--budget-s", type=float, default=240, help="shapes past this many seconds are skipped")
    parser.add_argument("--tokens", help="comma-separated token counts M (default: decode 1..256, prefill 512..8192)")
    parser.add_argument("--groups", help="comma-separated layer groups (default: all four)")
    parser.add_argument("--extra-configs", default="",
                        help="';'-separated Triton configs block_m,block_n,block_k,warps,stages to time too")
    args = parser.parse_args()
    from atom_aot.ops.triton._common import GemmConfig
    EXTRA_CONFIGS.extend(GemmConfig(*map(int, c.split(","))) for c in args.extra_configs.split(";") if c)
    import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::fp8_linear)
    device = "cpu" if args.smoke else "cuda"
    shapes, tokens = (SMOKE_SHAPES, (3, 17)) if args.smoke else (LLAMA_8B, TOKENS)
    if args.tokens:
        tokens = tuple(int(m) for m in args.tokens.split(","))
    if args.groups:
        shapes = {g: shapes[g] for g in args.groups.split(",")}
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    deadline, rows, skipped = time.time() + args.budget_s, [], []
    for group, (n, k) in shapes.items():
        for m in tokens:
            if time.time() > deadline:
                skipped.append(f"{group} m={m}")
                continue
            rows.append(bench_shape(group, n, k, m, device, args.smoke))
            args.out.write_text(json.dumps({"env": env, "model_shapes": "Llama-3.1-8B" if not args.smoke else "smoke",
                                            "rows": rows, "skipped_past_budget": skipped}, indent=1) + "\n")
    args.out.write_text(json.dumps({"env": env, "model_shapes": "Llama-3.1-8B" if not args.smoke else "smoke",
                                    "rows": rows, "skipped_past_budget": skipped}, indent=1) + "\n")
    print(f"wrote {args.out} ({len(rows)} shapes, {len(skipped)} skipped past the budget)")


if __name__ == "__main__":
    main()
