#!/usr/bin/env python
"""`python scripts/analyze_trace.py TRACE.json[.gz] [--top 15] [--out SUMMARY.md]`: where the time
went in a torch profiler Chrome trace, as Markdown.

- steps: ranges named `prefill[...]` / `decode[...]` (what `atom_aot.examples.profile_offline`
  writes), with their count, time and tokens;
- top CPU ops by self time and top GPU kernels by time, each split by the phase they ran in
  (a kernel counts for the phase whose step launched it);
- per layer: ranges named `layer[i]` (profile_offline, eager path) or `nn.Module: ...Layer_i`
  (with Python stacks), split by phase.
A trace without step ranges (e.g. from the server's /start_profile) still gets the op tables.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass

STEP = re.compile(r"^(prefill|decode)\b(?:\[.*?tokens=(\d+))?")
LAYER = re.compile(r"^layer\[(\d+)\]$|^nn\.Module: \w*Layer_(\d+)$")
PHASES = ("prefill", "decode")


@dataclass
class Event:
    name: str
    cat: str
    ts: float          # microseconds
    dur: float
    pid: int | str
    tid: int | str
    args: dict

    @property
    def end(self) -> float:
        return self.ts + self.dur


def load_events(path: str) -> list[Event]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    raw = data["traceEvents"] if isinstance(data, dict) else data
    return [Event(e.get("name", ""), e.get("cat", ""), float(e["ts"]), float(e.get("dur", 0)), e.get("pid"),
                  e.get("tid"), e.get("args") or {}) for e in raw if e.get("ph") == "X" and "ts" in e]


class Phases:
    """The step ranges on the CPU, to say which phase a CPU timestamp belongs to."""

    def __init__(self, events: list[Event]):
        self.steps = sorted((e for e in events if e.cat == "user_annotation" and STEP.match(e.name)),
                            key=lambda e: e.ts)
        self._starts = [s.ts for s in self.steps]

    def at(self, ts: float) -> str | None:
        i = bisect.bisect_right(self._starts, ts) - 1
        if i >= 0 and ts <= self.steps[i].end:
            return STEP.match(self.steps[i].name).group(1)
        return None


def self_times(ops: list[Event]) -> dict[int, float]:
    """Exclusive time of each CPU op (its duration minus its direct child ops'), keyed by id()."""
    result = {}
    by_thread = defaultdict(list)
    for op in ops:
        by_thread[(op.pid, op.tid)].append(op)
    for thread_ops in by_thread.values():
        stack: list[Event] = []
        for op in sorted(thread_ops, key=lambda e: (e.ts, -e.dur)):
            while stack and stack[-1].end <= op.ts:
                stack.pop()
            result[id(op)] = op.dur
            if stack:
                result[id(stack[-1])] -= op.dur
            stack.append(op)
    return result


def step_table(phases: Phases) -> list[str]:
    rows = ["| phase | steps | total ms | mean ms | tokens | ms / token |", "|---|---:|---:|---:|---:|---:|"]
    for phase in PHASES:
        steps = [s for s in phases.steps if STEP.match(s.name).group(1) == phase]
        if not steps:
            continue
        total = sum(s.dur for s in steps) / 1000
        tokens = sum(int(STEP.match(s.name).group(2) or 0) for s in steps)
        per_token = f"{total / tokens:.3f}" if tokens else "-"
        rows.append(f"| {phase} | {len(steps)} | {total:.1f} | {total / len(steps):.2f} | {tokens} | {per_token} |")
    return rows


def top_table(title: str, items: list[tuple[Event, float]], phases: Phases, top: int, when=None) -> list[str]:
    """`items`: (event, time us); grouped by name, sorted by total time, split by phase."""
    when = when or (lambda e: phases.at(e.ts))
    totals, calls = defaultdict(float), defaultdict(int)
    by_phase = defaultdict(lambda: defaultdict(float))
    for event, us in items:
        totals[event.name] += us
        calls[event.name] += 1
        by_phase[event.name][when(event)] += us
    grand = sum(totals.values()) or 1.0
    rows = [f"### {title}", "", "| name | calls | total ms | % | prefill ms | decode ms |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1])[:top]:
        split = " | ".join(f"{by_phase[name][p] / 1000:.2f}" for p in PHASES)
        rows.append(f"| `{_short(name)}` | {calls[name]} | {us / 1000:.2f} | {100 * us / grand:.1f} | {split} |")
    return rows + [""]


def op_coverage(ops: list[Event], own: dict[int, float], phases: Phases) -> list[str]:
    """How much of the step time the op table explains: compiled code (AOTInductor) runs its
    kernels without op events, so a low share points there, or at Python overhead."""
    step_us = sum(s.dur for s in phases.steps)
    if not step_us:
        return []
    in_ops = sum(own[id(op)] for op in ops if phases.at(op.ts))
    return [f"CPU ops account for {in_ops / 1000:.1f} ms of the {step_us / 1000:.1f} ms in steps "
            f"({100 * in_ops / step_us:.0f}%); the rest is Python and compiled code the profiler does not "
            f"split into ops.", ""]


def kernel_phase(events: list[Event], phases: Phases):
    """Phase of a GPU kernel: that of the CPU launch with the same correlation id."""
    launch_ts = {e.args.get("correlation"): e.ts for e in events
                 if e.cat in ("cuda_runtime", "cuda_driver") and e.args.get("correlation") is not None}
    return lambda k: phases.at(launch_ts[k.args.get("correlation")]) if k.args.get("correlation") in launch_ts else None


def layer_table(events: list[Event], phases: Phases) -> list[str]:
    layers = [e for e in events if e.cat in ("user_annotation", "python_function") and LAYER.match(e.name)]
    if not layers:
        return ["No per-layer ranges in this trace: compiled code has no layers to see. Profile the eager "
                "path (`profile_offline --enforce-eager`) for a per-layer breakdown.", ""]
    per = defaultdict(lambda: defaultdict(float))
    for e in layers:
        match = LAYER.match(e.name)
        per[int(match.group(1) or match.group(2))][phases.at(e.ts)] += e.dur
    step_us = sum(s.dur for s in phases.steps) or 1.0
    rows = ["| layer | total ms | prefill ms | decode ms | % of step time |", "|---:|---:|---:|---:|---:|"]
    for index in sorted(per):
        total = sum(per[index].values())
        rows.append(f"| {index} | {total / 1000:.2f} | {per[index]['prefill'] / 1000:.2f} | "
                    f"{per[index]['decode'] / 1000:.2f} | {100 * total / step_us:.1f} |")
    in_layers = sum(sum(v.values()) for v in per.values())
    rows.append(f"\nLayers: {in_layers / 1000:.1f} ms of {step_us / 1000:.1f} ms in steps "
                f"({100 * in_layers / step_us:.0f}%); the rest is embedding, lm_head, sampling and input preparation.")
    return rows + [""]


def summarize(path: str, top: int = 15) -> str:
    events = load_events(path)
    if not events:
        return f"# {path}\n\nNo timed events in this trace.\n"
    phases = Phases(events)
    span_ms = (max(e.end for e in events) - min(e.ts for e in events)) / 1000
    lines = [f"# Trace summary: `{path}`", "", f"Profiled span {span_ms:.1f} ms, {len(events)} events.", "",
             "## Steps", ""]
    lines += step_table(phases) if phases.steps else ["No `prefill[...]`/`decode[...]` ranges in this trace."]
    lines += ["", "## Where the time went", ""]
    ops = [e for e in events if e.cat == "cpu_op"]
    own = self_times(ops)
    lines += top_table("CPU ops by self time", [(op, own[id(op)]) for op in ops], phases, top)
    lines += op_coverage(ops, own, phases)
    kernels = [e for e in events if e.cat == "kernel"]
    if kernels:
        lines += top_table("GPU kernels by time", [(k, k.dur) for k in kernels], phases, top,
                           kernel_phase(events, phases))
    lines += ["## Per layer", ""] + layer_table(events, phases)
    return "\n".join(lines)


def _short(name: str, width: int = 80) -> str:
    name = name.replace("|", "/")
    return name if len(name) <= width else name[:width - 3] + "..."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="Chrome trace from torch.profiler (.json or .json.gz)")
    p.add_argument("--top", type=int, default=15, help="rows in each op/kernel table")
    p.add_argument("--out", default=None, help="also write the Markdown here")
    args = p.parse_args(argv)
    text = summarize(args.trace, args.top)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
