"""The one JSON a run writes: what ran (scenario, command, commit, versions, device) and every figure of both
engines, with the ours/vLLM ratios, named DEVICE-SCENARIO-DATE.json (scenario names begin with the model)."""
from __future__ import annotations

import dataclasses
import datetime
import json
import re
import subprocess
from pathlib import Path

from atom_aot.bench.gpu.scenarios import GPU_MEMORY_UTILIZATION, MAX_NUM_SEQS, Scenario

KNOWN_GPUS = ("H100", "H200", "H20", "B200", "GB200", "A100", "L40S", "MI300X", "MI325X", "MI355X")


def device_slug(device: str, gpus: int) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100' ('h100x2' for a run over two GPUs)."""
    named = next((g for g in sorted(KNOWN_GPUS, key=len, reverse=True) if re.search(rf"\b{g}\b", device)), None)
    slug = (named or re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "unknown").lower()
    return slug if gpus == 1 else f"{slug}x{gpus}"


def file_name(device: str, s: Scenario, date: datetime.date) -> str:
    return f"{device_slug(device, s.gpus)}-{s.name}-{date.isoformat()}.json"


def commit_of(repo: Path) -> str:
    """HEAD, marked '+changes' when the working tree differs from it; said so when there is no git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git checkout here; pass --commit)"
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def ratios(engines: dict) -> dict:
    """ours over vLLM for rates (higher is better), vLLM over ours for times (lower is better): > 1 favours ours."""
    ours, peer = engines.get("ours") or {}, engines.get("vllm") or {}
    out = {}
    for kind in ("throughput", "sampled"):
        if kind in ours and kind in peer:
            out[f"{kind}_output_tok_s"] = ours[kind]["output_tok_s"] / peer[kind]["output_tok_s"]
    if "tpot" in ours and "tpot" in peer:
        out["tpot_speedup"] = peer["tpot"]["tpot_s"] / ours["tpot"]["tpot_s"]
    if "prefill" in ours and "prefill" in peer:
        out["prefill_speedup"] = peer["prefill"]["seconds"] / ours["prefill"]["seconds"]
    if "serving" in ours and "serving" in peer:
        out["serving_output_throughput"] = (ours["serving"]["client"]["output_throughput"]
                                            / peer["serving"]["client"]["output_throughput"])
    if "cold" in ours and "cold" in peer:
        best = min((r["first_token_s"] for r in ours["cold"].values() if r.get("first_token_s")), default=None)
        vllm_cold = peer["cold"].get("cold_compile_cache", {}).get("first_token_s")
        if best and vllm_cold:
            out["cold_start_speedup"] = vllm_cold / best
    return out


def assemble(s: Scenario, engines: dict, errors: dict, command: list[str], commit: str,
             date: datetime.date) -> dict:
    devices = {e.get("device") for e in engines.values() if e.get("device")}
    return {"scenario": s.name, "summary": s.summary, "date": date.isoformat(),
            "device": ", ".join(sorted(devices)) or "unknown (no engine finished)", "gpus": s.gpus,
            "commit": commit, "command": command,
            "versions": {name: e.get("versions") for name, e in engines.items()},
            "settings": {"scenario": dataclasses.asdict(s), "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
                         "max_num_seqs": MAX_NUM_SEQS},
            "engines": engines, "ratios": ratios(engines), "errors": errors}


def write(result: dict, out: Path, s: Scenario, date: datetime.date) -> Path:
    """`out` is the file, or a folder that gets the DEVICE-SCENARIO-DATE name."""
    path = out / file_name(result["device"], s, date) if out.is_dir() else out
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return path
