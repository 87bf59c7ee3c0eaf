"""How long N processes take to open their CUDA context when they start at once, as a tensor-parallel start's
ranks do (four ranks' `target check + device` took 1.9 s against 0.9 s for two):

  python scripts/gpu/cuda_init_parallel.py --world 4 --out FILE.json

Each arm starts WORLD fresh interpreters together (torch imported before the clock starts, then a barrier file);
each opens the context of GPU `rank` (set_device + a first allocation) and reports its seconds. Arms: every GPU
visible to every process (what the ranks do today) and each process seeing only its own GPU; then one process
alone, both ways.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import os, sys, time
import torch
go, rank = sys.argv[1], int(sys.argv[2])
open(go + f".ready{rank}", "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
start = time.perf_counter()
torch.cuda.set_device(int(sys.argv[3]))
torch.empty(1, device="cuda")
torch.cuda.synchronize()
print(f"{time.perf_counter() - start:.3f}", flush=True)
"""


def arm(world: int, own_only: bool, gpus: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        go = os.path.join(tmp, "go")
        procs = []
        for rank in range(world):
            env = dict(os.environ)
            env["CUDA_VISIBLE_DEVICES"] = str(rank) if own_only else ",".join(map(str, range(gpus)))
            procs.append(subprocess.Popen([sys.executable, "-c", CHILD, go, str(rank), "0" if own_only else str(rank)],
                                          env=env, stdout=subprocess.PIPE, text=True))
        while sum(os.path.exists(go + f".ready{r}") for r in range(world)) < world:
            time.sleep(0.01)
        open(go, "w").close()
        return [float(p.communicate()[0].strip() or "nan") for p in procs]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    report = {}
    for name, world, own in (("together_all_visible", a.world, False), ("together_own_gpu_only", a.world, True),
                             ("alone_all_visible", 1, False), ("alone_own_gpu_only", 1, True),
                             ("together_all_visible_again", a.world, False)):
        report[name] = arm(world, own, a.world)
        print(name, report[name], flush=True)
        json.dump(report, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
