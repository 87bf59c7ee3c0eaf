"""Check and time the INT8 W8A8 CUDA path (atom_aot/ops/int8.py) on Llama-3.1-8B's linear shapes.

    PYTHONPATH=. python scripts/bench_int8.py --out $OUT/int8-gemm.json       # H100/H200, ~2 min

1. Correctness: `atom::int8_linear` on CUDA (rows padded by 16, torch._int_mm) and the same path
   through torch.compile (the quantization and scaling fused by Inductor, as in an AOTInductor
   package) against the CPU reference on the same inputs, at M in 1..300, dynamic and static.
2. Timing per layer group and M: bf16 F.linear (cuBLAS), int8 eager (separate kernels), int8
   compiled, and torch._int_mm alone; the build's measure_ms (CUDA-graph replay, median).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from atom_aot.ops.int8 import INT8_MAX, int8_linear_int_mm, int8_linear_reference, quantize_weight_int8

LLAMA_8B = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
            "down_proj": (4096, 14336)}
TOKENS = (1, 8, 32, 128, 256, 512, 2048, 8192)


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def check(compiled) -> list[dict]:
    rows = []
    g = torch.Generator().manual_seed(0)
    w = torch.randn(264, 512, generator=g) / 512 ** 0.5
    weight, scale = quantize_weight_int8(w)
    for m in (1, 5, 16, 17, 64, 300):
        for static in (False, True):
            x = (torch.randn(m, 512, generator=g) * 3).bfloat16()
            input_scale = (x.float().abs().amax() / INT8_MAX).reshape(1) if static else None
            b = torch.randn(264, generator=g).bfloat16()
            ref = int8_linear_reference(x, weight, scale, input_scale, b)
            args = [t.cuda() if t is not None else None for t in (x, weight, scale, input_scale, b)]
            op = torch.ops.atom.int8_linear(*args).cpu()
            fused = compiled(*args).cpu()
            rows.append({"m": m, "static": static, "op_vs_reference": rel_error(op, ref),
                         "op_equal_reference": bool(torch.equal(op, ref)),
                         "compiled_vs_reference": rel_error(fused, ref)})
            assert rows[-1]["op_vs_reference"] < 1e-2 and rows[-1]["compiled_vs_reference"] < 1e-2, rows[-1]
    return rows


def bench(compiled) -> list[dict]:
    from atom_aot.ops.triton.timing import measure_ms
    rows = []
    for group, (n, k) in LLAMA_8B.items():
        w = torch.randn(n, k, device="cuda") / k ** 0.5
        weight, scale = quantize_weight_int8(w)
        w16 = w.bfloat16()
        for m in TOKENS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            xq = torch.randint(-127, 128, (m + 16, k), device="cuda", dtype=torch.int8)
            row = {"group": group, "m": m, "n": n, "k": k}
            row["bf16_ms"] = measure_ms(lambda: torch.nn.functional.linear(x, w16))[0]
            row["int8_eager_ms"] = measure_ms(lambda: int8_linear_int_mm(x, weight, scale, None, None))[0]
            row["int8_compiled_ms"] = measure_ms(lambda: compiled(x, weight, scale, None, None))[0]
            row["int_mm_only_ms"] = measure_ms(lambda: torch._int_mm(xq, weight.t()))[0]
            row["compiled_speedup_vs_bf16"] = row["bf16_ms"] / row["int8_compiled_ms"]
            print(json.dumps(row), flush=True)
            rows.append(row)
        del w, weight, w16
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check-only", action="store_true")
    args = parser.parse_args()
    import atom_aot.ops  # noqa: F401  (registers atom::int8_linear)
    compiled = torch.compile(int8_linear_int_mm, dynamic=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "check": check(compiled)}
    print(json.dumps(result["check"]), flush=True)
    if not args.check_only:
        result["timings"] = bench(compiled)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
