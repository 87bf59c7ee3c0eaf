"""MLA's absorbed decode kernel (`atom_triton::mla_decode`) at DeepSeek-V3's shapes (128 heads, r 512, rope 64,
blocks of 16, bf16) on one GPU: a grid of configs wider than the build's candidates, at the batches and
contexts the build measures and the ones a 256 x 1024/512 run decodes at. Each case records every candidate's
median ms (replayed from a CUDA graph, L2 flushed), the fastest, the fastest of the build's candidates, the achieved
latent read rate and MMA rate, and the fastest config's error against the float32 reference op.

    PYTHONPATH=. python scripts/gpu/bench_mla_decode.py --out $OUT/mla_decode.json       # H100/H200, ~2-4 min
    PYTHONPATH=. python scripts/gpu/bench_mla_decode.py --out /tmp/d.json --smoke        # CPU interpreter, tiny

The build measures `CANDIDATE_CONFIGS` (ops/triton/mla_decode.py); this grid is what that list is chosen from.
The --budget (seconds) skips the cases that are left.
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
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))          # the interpreter patch and error metric the tests use

import torch  # noqa: E402

from atom_aot.ops.mla import gather_latent  # noqa: E402
from atom_aot.ops.triton.batch_inputs import make_paged_batch  # noqa: E402
from atom_aot.ops.triton.mla_decode import CANDIDATE_CONFIGS, MLADecodeConfig, config_table, launch_mla_decode  # noqa: E402
from triton_kernel_checks import patch_triton_interpreter, rel_error  # noqa: E402

HEADS, RANK, ROPE, QK_HEAD_DIM = 128, 512, 64, 192
CASES = [(1, 2048), (8, 2048), (32, 2048), (128, 2048), (256, 1024), (256, 1280), (256, 2048)]
SMOKE_CASES = [(3, 40)]


def grid() -> list[MLADecodeConfig]:
    """The build's candidates, then heads per program 32 or 64 x key tiles 16-64 x 4 or 8 warps x 1-3 pipeline
    stages, and 64 heads with 16 warps or 128-key tiles (128 heads per program do not compile: ptxas runs out of
    registers; a tile past shared memory is recorded as null)."""
    configs = list(CANDIDATE_CONFIGS)
    tiles = [(h, n, w) for h in (32, 64) for n in (16, 32, 64) for w in (4, 8)]
    tiles += [(64, 64, 16), (64, 128, 8), (64, 128, 16)]       # past the 2026-12-03 grid's best (64, 64, 8)
    for h, n, w in tiles:
        for stages in (1, 2, 3):
            c = MLADecodeConfig(h, n, w, stages, 512, 32)
            if c not in configs:
                configs.append(c)
    return configs


def reference(q, batch, lens, scale):
    """float32 absorbed attention over each sequence's gathered latents: o_lat [B, H, r]."""
    kv_layer = batch.kv_cache[0, 0]
    out = torch.empty(q.shape[0], HEADS, RANK, dtype=torch.float32, device=q.device)
    for b, n in enumerate(lens):
        lat = gather_latent(kv_layer[None], batch.block_tables[b], n).reshape(n, RANK + ROPE).float()
        s = torch.einsum("hd,nd->hn", q[b].float(), lat) * scale
        out[b] = torch.softmax(s, -1) @ lat[:, :RANK]
    return out


def run_case(num_seqs: int, context: int, configs, device: str, timer) -> dict:
    lens = [context] * num_seqs
    batch = make_paged_batch([c - 1 for c in lens], [1] * num_seqs, 1, RANK + ROPE, block_size=16, num_layers=1,
                             dtype=torch.bfloat16 if device == "cuda" else torch.float32, device=device)
    kv_cache = batch.kv_cache[:, :1]
    q = torch.randn(num_seqs, HEADS, RANK + ROPE, device=device, dtype=kv_cache.dtype)
    scale = QK_HEAD_DIM ** -0.5

    def call(c):
        return launch_mla_decode(q, kv_cache, 0, batch.block_tables, batch.seq_lens, scale, RANK, config_table(c))

    times: dict[str, float | None] = {}
    for c in configs:
        times[",".join(map(str, c.as_args()))] = timer(lambda c=c: call(c), c)
    ok = {k: v for k, v in times.items() if v is not None}
    fastest = min(ok, key=ok.get)
    build = {",".join(map(str, c.as_args())) for c in CANDIDATE_CONFIGS} & set(ok)
    fastest_build = min(build, key=ok.get)
    best = MLADecodeConfig(*map(int, fastest.split(",")))
    err = rel_error(call(best).float(), reference(q, batch, lens, scale))
    kv_bytes = num_seqs * context * (RANK + ROPE) * kv_cache.element_size()
    flops = 2 * num_seqs * HEADS * context * (RANK + ROPE + RANK)
    ms = ok[fastest]
    return {"batch": num_seqs, "context": context, "fastest": fastest, "fastest_ms": ms,
            "fastest_build_candidate": fastest_build, "fastest_build_candidate_ms": ok[fastest_build],
            "speedup_over_build_candidates": ok[fastest_build] / ms,
            "latent_read_tb_s": kv_bytes / ms / 1e9, "mma_tflop_s": flops / ms / 1e9,
            "rel_error_vs_fp32_reference": err, "ms": times}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes (checks the script runs)")
    p.add_argument("--budget", type=float, default=500.0, help="seconds; the cases left after it are skipped")
    p.add_argument("--cases", help="BATCHxCONTEXT,... to run instead of every case (e.g. 256x1280,1x2048)")
    args = p.parse_args()
    start = time.monotonic()
    if args.smoke:
        patch_triton_interpreter()
        device, cases, configs = "cpu", SMOKE_CASES, [MLADecodeConfig(16, 16, 4, 1, 512, 32), CANDIDATE_CONFIGS[0]]

        def timer(fn, c):
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
    else:
        from atom_aot.build.measure import ms_unless_too_big
        device, configs, timer = "cuda", grid(), ms_unless_too_big
        cases = [tuple(map(int, c.split("x"))) for c in args.cases.split(",")] if args.cases else CASES
    result = {"command": " ".join(["python", *sys.argv]),
              "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)",
              "torch": torch.__version__, "shapes": {"heads": HEADS, "kv_lora_rank": RANK, "rope": ROPE,
                                                     "block_size": 16, "dtype": "bfloat16"},
              "configs": [",".join(map(str, c.as_args())) for c in configs],
              "config_fields": "block_h,block_n,num_warps,num_stages,target_programs,max_splits",
              "cases": [], "errors": {}, "skipped": []}
    for num_seqs, context in cases:
        name = f"{num_seqs}x{context}"
        if time.monotonic() - start > args.budget:
            result["skipped"].append(name)
            continue
        try:
            row = run_case(num_seqs, context, configs, device, timer)
            result["cases"].append(row)
            print(name, row["fastest"], f"{row['fastest_ms']:.3f} ms", "build's best", row["fastest_build_candidate"],
                  f"{row['fastest_build_candidate_ms']:.3f} ms", flush=True)
        except Exception:  # noqa: BLE001  (one case failing is recorded; the rest still run)
            result["errors"][name] = traceback.format_exc()[-2000:]
        Path(args.out).write_text(json.dumps(result, indent=1))
    result["seconds"] = time.monotonic() - start
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
