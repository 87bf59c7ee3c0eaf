"""Where the seconds of mapping peer memory go (`join: peer memory: buffers mapped` took 1.9-3.0 s on
two and four H200s, with nothing loading beside it in the kernel bench):

  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
      python scripts/gpu/symm_mem_setup_timing.py --world 2 --out F.json

`ARMS=a,b` picks arms (default all). Each arm is a fresh set of WORLD ranks (spawned): CUDA context, NCCL
process group, a barrier, then per step a barrier (so no rank waits on a late one) and the step's seconds on
every rank: `torch.distributed._symmetric_memory`'s `empty` and `rendezvous` for a small and a large allocation
(which one first depends on the arm); other arms open each peer GPU's context first (whether the mapping's cost is
the peers' contexts), set TORCH_SYMMMEM=CUDA or call set_backend("CUDA"), or make the first `empty` in a thread
while the process group starts.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

MIB = 1 << 20
ARMS = {"small-first": ["empty+rendezvous 1MiB", "empty+rendezvous 36MiB", "empty+rendezvous 36MiB"],
        "large-first": ["empty+rendezvous 36MiB", "empty+rendezvous 1MiB"],
        "peer-contexts-first": ["peer contexts", "empty+rendezvous 36MiB", "empty+rendezvous 36MiB"],
        "env-TORCH_SYMMMEM=CUDA": ["empty+rendezvous 36MiB", "empty+rendezvous 36MiB"],
        "set_backend-CUDA": ["set_backend CUDA", "empty+rendezvous 36MiB", "empty+rendezvous 36MiB"],
        "empty-beside-process-group": ["empty+rendezvous 36MiB", "empty+rendezvous 36MiB"]}
ONLY = os.environ.get("ARMS", "").split(",") if os.environ.get("ARMS") else list(ARMS)


def step(name: str, rank: int, world: int, group_name: str) -> dict:
    import torch.distributed._symmetric_memory as symm
    dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    if name == "peer contexts":
        for peer in range(world):
            if peer != rank:
                torch.empty(1, device=f"cuda:{peer}")
                torch.cuda.synchronize(peer)
        return {"step": name, "s": round(time.perf_counter() - start, 4)}
    if name == "set_backend CUDA":
        symm.set_backend("CUDA")
        return {"step": name, "s": round(time.perf_counter() - start, 4)}
    size = int(name.split()[-1].removesuffix("MiB")) * MIB
    memory = symm.empty(size, dtype=torch.uint8, device=f"cuda:{rank}")
    torch.cuda.synchronize()
    allocated = time.perf_counter()
    symm.rendezvous(memory, group_name)
    torch.cuda.synchronize()
    done = time.perf_counter()
    return {"step": name, "empty_s": round(allocated - start, 4), "rendezvous_s": round(done - allocated, 4)}


def rank_main(rank: int, world: int, port: int, arm: str, out_path: str) -> None:
    start = time.perf_counter()
    torch.cuda.set_device(rank)
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    result = {"arm": arm, "rank": rank, "context_s": round(time.perf_counter() - start, 3)}
    if arm.startswith("env-"):
        name, value = arm.removeprefix("env-").split("=")
        os.environ[name] = value
    beside = None
    start = time.perf_counter()
    if arm == "empty-beside-process-group":     # the first `empty` in a thread while the process group starts
        import threading
        import torch.distributed._symmetric_memory as symm
        box = {}

        def allocate():
            torch.cuda.set_device(rank)
            t = time.perf_counter()
            box["memory"] = symm.empty(36 * MIB, dtype=torch.uint8, device=f"cuda:{rank}")
            box["s"] = time.perf_counter() - t
        beside = threading.Thread(target=allocate)
        beside.start()
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    dist.barrier()
    result["process_group_s"] = round(time.perf_counter() - start, 3)
    if beside is not None:
        beside.join()
        result["empty_beside_s"] = round(box["s"], 3)
        result["process_group_and_empty_s"] = round(time.perf_counter() - start, 3)
    result["steps"] = [step(name, rank, world, dist.group.WORLD.group_name) for name in ARMS[arm]]
    with open(f"{out_path}.rank{rank}", "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp
    from atom_aot.distributed.group import free_port
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    report = {"world": args.world, "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "arms": {}}
    for arm in ONLY:
        mp.spawn(rank_main, args=(args.world, free_port(), arm, args.out), nprocs=args.world, join=True)
        report["arms"][arm] = [json.load(open(f"{args.out}.rank{r}")) for r in range(args.world)]
        for r in range(args.world):
            os.remove(f"{args.out}.rank{r}")
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        first = report["arms"][arm][0]
        print(arm, {k: v for k, v in first.items() if k.endswith("_s")},
              [(s["step"], s.get("empty_s"), s.get("rendezvous_s", s.get("s"))) for s in first["steps"]], flush=True)


if __name__ == "__main__":
    main()
