"""The fused all-reduce + residual add + RMSNorm (ops/triton/all_reduce_norm.py) on GPUs of one host, one process
per GPU (the tensor-parallel decode step's all-reduces):

  python scripts/gpu/all_reduce_norm_gpus.py --world 2 --out FILE.json

- correct: for each token count, every rank's outputs against float64 sums of every rank's partial sums, and
  every rank's bits equal to rank 0's; which path each count takes (peer memory in the kernel, or summed before);
- replays: a CUDA graph of LAYERS chained calls (each call's residual the next one's), replayed REPLAYS times with
  fresh partial sums each time, every replay checked against the same computation from gathered partial sums
  (a rank that reused a buffer half a peer still read, or met the wrong count, shows here or hangs);
- timing: per call in CUDA graphs of CALLS_PER_GRAPH calls: the fused kernel (peer path where taken), the planned
  all-reduce (torch's one-shot / two-shot, or NCCL) then the kernel's add + norm alone (ATOM_ALL_REDUCE_NORM=
  separate's path, and the compiled graphs' before this kernel: all-reduce, then Inductor's add + norm), and NCCL
  then the add + norm.
Rank 0 writes the JSON after each part.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tp_two_gpus import _GRAPHS, _graphed, _time_cuda, CALLS_PER_GRAPH  # noqa: E402

HIDDEN, EPS = 4096, 1e-5
CHECK_TOKENS = (1, 2, 3, 63, 64, 128, 129, 256, 512, 513, 2048)
TIME_TOKENS = (1, 8, 32, 64, 128, 256)
LAYERS, REPLAYS = 16, 200


def _parts(tokens: int, world: int, seed: int, device) -> list[torch.Tensor]:
    """Every rank's partial sums for one call (each rank draws all, uses its own)."""
    return [torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16,
                        generator=torch.Generator(device).manual_seed(seed * 131 + r)) for r in range(world)]


def _expected(parts, residual, weight):
    """float64 sum of the ranks, rounded as an all-reduce's output would be, then the add and norm in float64."""
    summed = (sum(p.double() for p in parts).to(torch.bfloat16).double() + residual.double())
    normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + EPS)
    return weight.double() * normed, summed


def _same_on_every_rank(t: torch.Tensor, world: int) -> bool:
    import torch.distributed as dist
    gathered = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(gathered, t.contiguous())
    return all(torch.equal(g, gathered[0]) for g in gathered)


def correct(rank: int, world: int, device, table) -> list[dict]:
    from atom_aot.distributed.collectives import all_reduce_add_rms_norm, summed_in_norm_kernel
    from atom_aot.distributed.peer_table import TWO_SHOT_ROWS, two_shot_taken
    rows = []
    for i, tokens in enumerate(CHECK_TOKENS):
        parts = _parts(tokens, world, i, device)
        g = torch.Generator(device).manual_seed(10_000 + i)
        residual = torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16, generator=g)
        weight = torch.randn(HIDDEN, device=device, dtype=torch.bfloat16, generator=g)
        out, residual_out = all_reduce_add_rms_norm(parts[rank], residual, weight, EPS, table, world)
        want_out, want_residual = _expected(parts, residual, weight)
        peer_path = summed_in_norm_kernel(parts[rank])
        rows.append({"tokens": tokens, "peer_path": peer_path,
                     "two_shot": peer_path and two_shot_taken(tokens, int(table[TWO_SHOT_ROWS])),
                     "out_max_err": (out.double() - want_out).abs().max().item(),
                     "out_ref_max": want_out.abs().max().item(),
                     "residual_max_err": (residual_out.double() - want_residual).abs().max().item(),
                     "bits_equal_on_every_rank": _same_on_every_rank(out, world) and
                     _same_on_every_rank(residual_out, world)})
    return rows


def replays(rank: int, world: int, device, table, tokens: int) -> dict:
    import torch.distributed as dist
    from atom_aot.distributed.collectives import all_reduce_add_rms_norm
    g = torch.Generator(device).manual_seed(7)
    weights = [torch.rand(HIDDEN, device=device, dtype=torch.bfloat16, generator=g) + 0.5 for _ in range(LAYERS)]
    x = torch.zeros(LAYERS, tokens, HIDDEN, device=device, dtype=torch.bfloat16)
    residual0 = torch.zeros(tokens, HIDDEN, device=device, dtype=torch.bfloat16)
    outs: list = []

    def chain():
        outs.clear()
        residual = residual0
        for layer in range(LAYERS):
            out, residual = all_reduce_add_rms_norm(x[layer], residual, weights[layer], EPS, table, world)
            outs.append(out)
        outs.append(residual)
    replay = _graphed(chain, calls=1)
    worst = 0.0
    for step in range(REPLAYS):
        gen = torch.Generator(device).manual_seed(1000 * step + rank)
        x.copy_(torch.randn(x.shape, device=device, dtype=torch.bfloat16, generator=gen))
        residual0.copy_(torch.randn(residual0.shape, device=device, dtype=torch.bfloat16,
                                    generator=torch.Generator(device).manual_seed(step)))
        replay()
        every = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(every, x)
        residual = residual0.double()
        for layer in range(LAYERS):
            want_out, residual = _expected([e[layer] for e in every], residual.to(torch.bfloat16), weights[layer])
            worst = max(worst, (outs[layer].double() - want_out).abs().max().item() / (want_out.abs().max().item()))
        worst = max(worst, (outs[-1].double() - residual).abs().max().item() / residual.abs().max().item())
    return {"tokens": tokens, "layers": LAYERS, "replays": REPLAYS, "worst_relative_err": worst,
            "final_bits_equal_on_every_rank": _same_on_every_rank(outs[-1], world)}


def timing(rank: int, world: int, device, table, tokens: int) -> dict:
    import torch.distributed as dist
    from atom_aot.distributed import collectives
    from atom_aot.ops.triton.all_reduce_norm import all_reduce_add_rms_norm as kernel
    x = torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16)
    residual = torch.randn(tokens, HIDDEN, device=device, dtype=torch.bfloat16)
    weight = torch.randn(HIDDEN, device=device, dtype=torch.bfloat16)
    no_peers = torch.zeros_like(table)

    def fused():
        collectives.all_reduce_add_rms_norm(x, residual, weight, EPS, table, world)

    def planned_then_norm():
        kernel(x, collectives.all_reduce(x), residual, weight, no_peers, EPS, world)

    def nccl_then_norm():
        reduced = x.clone()
        dist.all_reduce(reduced)
        kernel(x, reduced, residual, weight, no_peers, EPS, world)
    from atom_aot.distributed.peer_table import TWO_SHOT_ROWS, two_shot_taken
    peer_path = collectives.summed_in_norm_kernel(x)
    row = {"tokens": tokens, "bytes": tokens * HIDDEN * 2, "peer_path": peer_path,
           "two_shot": peer_path and two_shot_taken(tokens, int(table[TWO_SHOT_ROWS])),
           "planned_all_reduce": collectives.all_reduce_path(x)}
    for name, fn in (("fused", fused), ("planned_all_reduce_then_norm", planned_then_norm),
                     ("nccl_then_norm", nccl_then_norm)):
        row[f"{name}_graph_us"] = round(_time_cuda(_graphed(fn), 20) / CALLS_PER_GRAPH * 1e6, 2)
    return row


def rank_main(rank: int, world: int, port: int, out_path: str) -> None:
    from atom_aot.distributed.collectives import peer_table
    from atom_aot.distributed.group import RankPlace, join, leave
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    group = join(RankPlace(rank, world, "127.0.0.1", port, rank), device)
    table = peer_table(device)
    result = {"world_size": world, "hidden": HIDDEN, "dtype": "bfloat16", "device": torch.cuda.get_device_name(device),
              "table_slab_bytes": int(table[1]), "table_two_shot_rows": int(table[-1]),
              "join_s": {name: round(seconds, 3) for name, seconds in group.join_timings.items()}}

    def save(key, value):
        result[key] = value
        if rank == 0:
            Path(out_path).write_text(json.dumps(result, indent=1))
    save("correct", correct(rank, world, device, table))
    save("replays", [replays(rank, world, device, table, t) for t in (1, 64, 256)])   # 256: two-shot
    save("timing", [timing(rank, world, device, table, t) for t in TIME_TOKENS])
    torch.cuda.synchronize()
    for graph in _GRAPHS:
        graph.reset()
    leave()


def main() -> None:
    import torch.multiprocessing as mp
    from atom_aot.distributed.group import free_port
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    mp.spawn(rank_main, args=(args.world, free_port(), args.out), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
