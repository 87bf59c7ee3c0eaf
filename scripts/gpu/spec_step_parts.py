"""Where a speculative engine's batch-1 step goes: the engine step, and inside it the scheduler (with the
proposer's `propose`), the inputs, the verify forward, the acceptance (its read-back) and the MTP layer's
`observe`, each timed with the device synchronized before and after it (so a part's time is its own work,
host and device, not what it overlaps; a step's parts then add up to about the step).

  python scripts/gpu/spec_step_parts.py --artifact ART --vocab N --out FILE.json [--method mtp --k 1]
"""
from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict


def timed(totals: dict, counts: dict, name: str, call, sync):
    def wrapper(*args, **kwargs):
        sync()
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            sync()
            totals[name] += time.perf_counter() - start
            counts[name] += 1
    return wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--artifact", required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--method", default="mtp")
    p.add_argument("--k", type=int, default=1)
    p.add_argument("--tokens", type=int, default=256)
    a = p.parse_args()
    import torch
    from atom_aot import LLMEngine, SamplingParams
    engine = LLMEngine(a.artifact, max_model_len=a.tokens + 256, gpu_memory_utilization=0.85, method=a.method,
                       num_speculative_tokens=a.k)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    prompt = [random.Random(3).randrange(100, a.vocab - 100) for _ in range(128)]
    params = SamplingParams(temperature=0, max_tokens=a.tokens, ignore_eos=True)
    engine.generate([prompt], params)                                     # warm-up
    core, totals, counts = engine.core, defaultdict(float), defaultdict(int)
    spec = core.runner
    parts = [("engine step", core, "step"), ("schedule (with propose)", core.scheduler, "schedule"),
             ("propose", core.scheduler.proposer, "propose"), ("prepare inputs", spec.runner, "prepare_inputs"),
             ("verify forward", spec, "verify_forward"), ("accept (argmax read back)", spec, "_verify")]
    if spec.observer is not None:
        parts.append(("observe (MTP layer)", spec.observer, "observe"))
    for name, owner, attr in parts:
        setattr(owner, attr, timed(totals, counts, name, getattr(owner, attr), sync))
    start = time.perf_counter()
    engine.generate([prompt], params)
    wall = time.perf_counter() - start
    steps = counts["engine step"]
    out = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
           "artifact": a.artifact, "method": a.method, "k": a.k, "tokens": a.tokens, "wall_s": wall, "steps": steps,
           "ms_per_step": {name: round(totals[name] / steps * 1e3, 3) for name in totals},
           "calls": dict(counts), "stats": engine.print_mtp_statistics()}
    json.dump(out, open(a.out, "w"), indent=1)
    print(json.dumps(out, indent=1, default=str))
    engine.close()


if __name__ == "__main__":
    main()
