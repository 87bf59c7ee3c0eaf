"""MLA's mixed-step attention at DeepSeek-V3's shapes (128 heads, r 512, rope 64, nope 128, v 128, bf16, blocks of
16) on one GPU: the triton mixed path (ops/backends/mla_mixed.py) with its prefix workspace, the same path with none
(every cached prefix absorbed in the prefix kernel: the path before the workspace) and the reference op, one layer's
whole call (rope, cache write, up-projections, kernels) each. Every number goes to the JSON named by --out.

    PYTHONPATH=. python scripts/gpu/bench_mla_mixed.py --out $OUT/mla_mixed.json        # H100/H200, ~7 min
    PYTHONPATH=. python scripts/gpu/bench_mla_mixed.py --out /tmp/m.json --smoke        # CPU interpreter, tiny

1. tuning: what the build would choose on this GPU (build/tune_mla_mixed.tune_mixed: chunk and prefix kernel
   configs, the workspace's tile and capacity, the longest absorbed query run, triton against reference) and every
   timing behind it;
2. cases: one sequence of 512-8192 new tokens over a cached prefix of 0, 1024 or 4096 tokens, 2048 over 16384 and
   4 x 1024 over 4096 each (prefixes past the workspace: the overflow absorbed); 8 x 1024 (a whole 8192-token
   prefill step); 256 decoding sequences (context 2048) with a 512-token prompt riding along; 64 verify-like runs
   of 4 tokens over 2048; some again with an fp8 cache. Each: the paths' median ms (the triton paths replayed from
   a CUDA graph, the reference op as it runs), the speed-ups, the attention's FLOPs per second counted as the naive
   form's (q.k over 192 dims, p.v over 128), and, up to 2048 new tokens, each path's relative error against a
   float32 run of the reference. The workspace's capacity is the tuning's, or its largest candidate where the
   tuning chose none, so the cached-prefix cases run it either way ("workspace" in the JSON says which).
One failing case is recorded under "errors" and the run goes on; the --budget (seconds) skips what is left.
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

from atom_aot.artifact.tuning import BackendChoice  # noqa: E402
from atom_aot.build.config import BuildConfig  # noqa: E402
from atom_aot.build.measure import best_config  # noqa: E402
from atom_aot.build.tune_mla_mixed import mixed_step, tune_mixed, workspace_capacities  # noqa: E402
from atom_aot.models import ModelConfig  # noqa: E402
from atom_aot.ops.backends import make_backend  # noqa: E402
from triton_kernel_checks import patch_triton_interpreter, rel_error  # noqa: E402

DECODE_ROW = {"mla_decode@1": (16, 32, 4, 2, 512, 32), "mla_decode@128": (64, 16, 8, 2, 512, 32)}   # the H200's
SINGLE = [([prefix], [chunk]) for chunk in (512, 1024, 2048, 4096, 8192) for prefix in (0, 1024, 4096)]
BATCHES = [([16384], [2048]), ([4096] * 4, [1024] * 4), ([0] * 8, [1024] * 8), ([2047] * 256 + [0], [1] * 256 + [512]),
           ([2044] * 64, [4] * 64)]
FP8 = [([1024], [2048]), ([2047] * 256 + [0], [1] * 256 + [512])]
SMOKE_CASES = [([0], [40]), ([21, 0, 3], [17, 30, 1]), ([5] * 4, [1] * 4)]
CHECK_MAX_TOKENS = 2048


def case_name(context_lens, query_lens, kv: str) -> str:
    groups: dict[tuple[int, int], int] = {}
    for c, n in zip(context_lens, query_lens):
        groups[(n, c)] = groups.get((n, c), 0) + 1
    return " + ".join(f"{count}x{n}+{c}" for (n, c), count in groups.items()) + f" {kv}"


def naive_flops(context_lens, query_lens, heads: int) -> float:
    """The attention's multiply-adds x 2 as the naive form counts them: each (query, visible key) pair costs
    q.k over nope + rope (192) and p.v over v (128) per head."""
    pairs = sum(n * c + n * (n + 1) / 2 for c, n in zip(context_lens, query_lens))
    return 2.0 * heads * pairs * (192 + 128)


def timed_ms(backend, args) -> float:
    from atom_aot.ops.triton.timing import measure_ms
    return measure_ms(lambda: backend(args))[0]


def with_capacity(choice: BackendChoice, capacity: int) -> BackendChoice:
    """`choice` with its prefix workspace's capacity replaced (0: none, every cached prefix absorbed)."""
    workspace = choice.params["mla_prefix_workspace"]
    return BackendChoice(choice.backend, {**choice.params, "mla_prefix_workspace": (capacity, *workspace[1:])})


def run_case(cfg: ModelConfig, build: BuildConfig, chosen: BackendChoice, context_lens, query_lens) -> dict:
    """One case's errors and timings: `triton` (the workspace), `triton_absorbed_prefix` (none; only where a
    cached prefix makes them differ) and `reference`."""
    args = mixed_step(cfg, build, context_lens, query_lens, device="cpu" if SMOKE else "cuda")
    paths = {"triton": chosen, "reference": BackendChoice("reference")}
    if any(context_lens):
        paths["triton_absorbed_prefix"] = with_capacity(chosen, 0)
    backends = {name: make_backend("mla_attention", choice) for name, choice in paths.items()}
    row = {}
    if sum(query_lens) <= CHECK_MAX_TOKENS:
        f32 = {name: getattr(args, name).float() for name in ("q_nope", "q_pe", "c_kv", "k_pe", "w_uk", "w_uv")}
        cache = args.inputs.kv_cache
        exact = backends["reference"](type(args)(**{**args.__dict__, **f32, "inputs": args.inputs._replace(
            kv_cache=cache.clone() if cache.element_size() == 1 else cache.float())}))
        for name, backend in backends.items():
            row[f"rel_error_{name}"] = rel_error(backend(args), exact)
    if not SMOKE:
        import triton.testing
        for name, backend in backends.items():
            row[f"{name}_ms"] = (triton.testing.do_bench(lambda: backend(args), return_mode="median")
                                 if name == "reference" else timed_ms(backend, args))
        row["speedup"] = row["reference_ms"] / row["triton_ms"]
        if "triton_absorbed_prefix_ms" in row:
            row["speedup_over_absorbed_prefix"] = row["triton_absorbed_prefix_ms"] / row["triton_ms"]
        heads = args.q_nope.shape[1]
        row["triton_tflops_as_naive"] = naive_flops(context_lens, query_lens, heads) / row["triton_ms"] / 1e9
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--config", default=str(ROOT / "scripts/gpu/configs/deepseek-v3.json"))
    p.add_argument("--budget", type=float, default=420.0, help="seconds from the start, tuning included; cases "
                                                                "past it are skipped")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, the tiny test model's shapes, checks only")
    a = p.parse_args()
    start = time.perf_counter()
    if SMOKE:
        patch_triton_interpreter()
        from deepseek_model import random_deepseek
        cfg, build = random_deepseek().config, BuildConfig(arch="cpu", dtype="float32")
    else:
        cfg, build = ModelConfig.from_json(Path(a.config)), BuildConfig(arch="sm90", dtype="bfloat16")
    out = {"device": "cpu (interpreter)" if SMOKE else torch.cuda.get_device_name(0), "heads": cfg.num_attention_heads,
           "cases": {}, "errors": {}, "skipped": []}
    if SMOKE:
        chosen = BackendChoice("triton", {**{"mla_decode@1": (16, 16, 4, 2, 512, 32)}, "mla_chunk": (16, 16, 4, 2),
                                          "mla_prefix": (16, 16, 4, 2), "mla_prefix_workspace": (16, 16, 16, 4, 2),
                                          "absorbed_runs": (2,)})
        cases = [(c, n, build) for c, n in SMOKE_CASES]
    else:
        build_choice, out["tuning"], out["tuning_label"] = tune_mixed(cfg, build, DECODE_ROW, best_config)
        out["build_choice"] = build_choice.to_dict()
        # the tuned triton path is measured whichever row the build would keep
        triton_choice = out["tuning"]["triton_choice"]
        chosen = BackendChoice("triton", {k: tuple(v) for k, v in triton_choice["params"].items()})
        tuned = chosen.params["mla_prefix_workspace"][0]
        if tuned == 0:                                  # the tuning chose none: its largest candidate is measured
            chosen = with_capacity(chosen, workspace_capacities(cfg, build)[-1])
        out["workspace"] = {"tuned_capacity": tuned, "measured_capacity": chosen.params["mla_prefix_workspace"][0]}
        fp8_build = BuildConfig(arch="sm90", dtype="bfloat16", kv_cache_dtype="fp8")
        cases = [(c, n, build) for c, n in SINGLE + BATCHES] + [(c, n, fp8_build) for c, n in FP8]
    out["chosen"] = chosen.to_dict()
    for context_lens, query_lens, case_build in cases:
        name = case_name(context_lens, query_lens, case_build.kv_cache_element_dtype)
        if time.perf_counter() - start > a.budget:
            out["skipped"].append(name)
            continue
        try:
            out["cases"][name] = run_case(cfg, case_build, chosen, context_lens, query_lens)
            print(name, out["cases"][name], flush=True)
        except Exception:  # noqa: BLE001  (one failing case is recorded; the rest still run)
            out["errors"][name] = traceback.format_exc()[-2000:]
        if not SMOKE:
            torch.cuda.empty_cache()
        Path(a.out).write_text(json.dumps(out, indent=1))
    out["seconds"] = time.perf_counter() - start
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k not in ("cases", "tuning")}, indent=1))


if __name__ == "__main__":
    main()
