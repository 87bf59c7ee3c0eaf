"""CUDA-graph capture sizes and the graph-pool bytes they need, measured at build (graphs.json),
so the runtime sets that memory aside before sizing the KV cache and captures without trial.

The build runs the runtime in a child process, as serving will: `python -m
atom_aot.entrypoints.graph_probe` loads the freshly compiled decode package and captures the graphs
with the runtime's own code. It is launched by module name and never imported here (build and
runtime do not import each other), and a process that has just compiled (Inductor, Triton JIT)
is not where the runtime's code ever runs. The child prints the GraphPlan as JSON.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

from atom_aot.artifact.build_options import drawn_at_load
from atom_aot.artifact.graph_plan import GraphPlan
from atom_aot.artifact.kv_cache import KVCacheSpec
from atom_aot.artifact.layout import package_member
from atom_aot.artifact.phase import Phase
from atom_aot.build.config import BuildConfig
from atom_aot.dtypes import dtype_name
from atom_aot.errors import BuildError

PROBE_MODULE = "atom_aot.entrypoints.graph_probe"
log = logging.getLogger("atom_aot")


def probe_capture_sizes(config: BuildConfig, staging: Path, max_model_len: int, quant_scheme: str,
                        kv_cache: KVCacheSpec) -> GraphPlan:
    """`quant_scheme`: the linears' resolved scheme, which the child needs to draw weights the staged tree
    does not store (--load-format dummy-at-load); `kv_cache`: the artifact's (its layout counts the MTP layers the
    artifact holds)."""
    if config.arch == "cpu" or not (staging / package_member(Phase.DECODE)).exists():
        return GraphPlan.none(f"no CUDA graphs on the {config.arch} arch")
    if not config.graph_capture_sizes:
        return GraphPlan.none("built with --capture-sizes none: no CUDA graphs")
    args = {"staging": str(staging), "sizes": list(config.graph_capture_sizes), "block_size": config.block_size,
            "kv_cache": kv_cache.to_dict(), "max_model_len": max_model_len, "split": dataclasses.asdict(config.split),
            "draw": ({"dtype": dtype_name(config.torch_dtype), "quant": quant_scheme}
                     if drawn_at_load(config.load_format) else None)}
    out = subprocess.run([sys.executable, "-m", PROBE_MODULE, json.dumps(args)], capture_output=True, text=True)
    if out.returncode != 0:
        raise BuildError(f"the capture-size probe ({PROBE_MODULE}) failed with exit code {out.returncode}; "
                         f"its last output:\n{out.stderr[-3000:]}")
    lines = out.stdout.strip().splitlines()
    plan = GraphPlan.from_json(lines[-1] if lines else "", f"the output of {PROBE_MODULE}")
    memory = plan.step_memory
    log.info("graph probe: %d sizes in a %.0f MiB pool; %s", len(plan.capture_sizes), plan.pool_bytes / 2**20,
             f"a step takes {memory.bytes_per_token} B per token, sampling {memory.bytes_per_logits_row} B per "
             f"logits row (measured at {memory.tokens} tokens, {memory.rows} rows)" if memory else plan.note)
    return plan
