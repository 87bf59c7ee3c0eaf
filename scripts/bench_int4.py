"""Check and time the INT4 W4A16 CUDA paths (atom_aot/ops/int4.py) on Llama-3.1-8B's linear shapes.

    PYTHONPATH=. python scripts/bench_int4.py --out $OUT/int4-gemm.json       # H100/H200, ~3 min

1. Correctness: the Triton GEMM (`atom_triton::int4_linear`, every candidate config), the small-M one
   (`atom_triton::int4_linear_small_m`, every config the group allows, M <= 16) and the `aten` CUDA path
   (dequantize, then cuBLAS) against the CPU reference on the same bf16 inputs, groups of 128 and per
   channel, at M in 1..300.
2. Timing per layer group and M: bf16 F.linear (cuBLAS), each Triton config, each small-M config (M <= 16)
   and the `aten` path compiled (as in a package); the build's measure_ms (CUDA-graph replay, median, L2
   flushed).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from atom_aot.ops.int4 import int4_linear_dequantized, int4_linear_reference

LLAMA_8B = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096),
            "down_proj": (4096, 14336)}
TOKENS = (1, 16, 64, 256, 2048)


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def random_layer(n: int, k: int, groups: int, device: str = "cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    scale = (torch.rand(n, groups, generator=g) * 0.01 + 0.001).half().float()
    zero = torch.randint(0, 17, (n, groups), generator=g, dtype=torch.uint8)
    return [t.to(device) for t in (weight, scale, zero)]


def small_m_configs(groups: int) -> list[tuple]:
    """The small-M configs the build times for these weights (a K step within one group of 128)."""
    from atom_aot.build.tune_fp8 import small_m_configs as build_configs
    return build_configs("int4-w4a16-channel" if groups == 1 else "int4-w4a16")


def check() -> list[dict]:
    from atom_aot.ops.triton.int4_gemm import CANDIDATE_CONFIGS, launch_int4_linear
    from atom_aot.ops.triton.int4_small_m import launch_int4_small_m
    rows = []
    for groups in (1, 4):
        layer = random_layer(264, 512, groups)
        g = torch.Generator().manual_seed(1)
        for m in (1, 5, 16, 17, 64, 300):
            x = (torch.randn(m, 512, generator=g) * 3).bfloat16()
            b = torch.randn(264, generator=g).bfloat16()
            ref = int4_linear_reference(x, *layer, b)
            args = [t.cuda() for t in (x, *layer, b)]
            row = {"m": m, "groups": groups,
                   "aten_vs_reference": rel_error(int4_linear_dequantized(*args).cpu(), ref)}
            for c in CANDIDATE_CONFIGS:
                row[f"triton{c.as_args()}_vs_reference"] = rel_error(launch_int4_linear(*args, *c.as_args()).cpu(), ref)
            for c in small_m_configs(groups) if m <= 16 else ():
                row[f"small_m{c}_vs_reference"] = rel_error(launch_int4_small_m(*args, *c).cpu(), ref)
            assert all(v < 1e-2 for key, v in row.items() if key.endswith("reference")), row
            rows.append(row)
    return rows


def bench(compiled) -> list[dict]:
    from atom_aot.ops.triton.int4_gemm import CANDIDATE_CONFIGS, launch_int4_linear
    from atom_aot.ops.triton.int4_small_m import launch_int4_small_m
    from atom_aot.ops.triton.timing import measure_ms
    rows = []
    for group, (n, k) in LLAMA_8B.items():
        layer = random_layer(n, k, k // 128, "cuda")
        w16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for m in TOKENS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            row = {"group": group, "m": m, "n": n, "k": k,
                   "bf16_ms": measure_ms(lambda: torch.nn.functional.linear(x, w16))[0],
                   "aten_compiled_ms": measure_ms(lambda: compiled(x, *layer, None))[0]}
            for c in CANDIDATE_CONFIGS:
                args = c.as_args()
                row[f"triton{args}_ms"] = measure_ms(lambda: launch_int4_linear(x, *layer, None, *args))[0]
            for c in small_m_configs(k // 128) if m <= 16 else ():
                row[f"small_m{c}_ms"] = measure_ms(lambda: launch_int4_small_m(x, *layer, None, *c))[0]
            best = min(v for key, v in row.items() if key.startswith(("triton", "small_m")))
            row["best_int4_speedup_vs_bf16"] = row["bf16_ms"] / best
            print(json.dumps(row), flush=True)
            rows.append(row)
        del layer, w16
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check-only", action="store_true")
    args = parser.parse_args()
    import atom_aot.ops  # noqa: F401  (registers atom::int4_linear)
    import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::int4_linear)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "check": check()}
    print(json.dumps(result["check"]), flush=True)
    if not args.check_only:
        result["timings"] = bench(torch.compile(int4_linear_dequantized, dynamic=True))
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
