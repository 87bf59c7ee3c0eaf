"""The fused all-reduce + add + RMSNorm kernel's peer path with ranks as processes, on the CPU: run by
tests/test_all_reduce_norm.py as `python tests/all_reduce_norm_ranks.py WORLD`, in Triton's interpreter.

Each rank is a spawned process running the kernel on its own partial sums; their buffers and signal pads are
shared CPU memory, each rank's peer table holding the addresses at which its process maps them, as peer-mapped
GPU memory would be. The calls alternate between messages that take the peer path and ones too large for the
slabs (summed before the kernel), and between one-shot and two-shot sums (peer_table.two_shot_rows_for the world
size: from 2 rows per program on 2 ranks, 3 on 3; with a second argument `one-shot`, never two-shot, the default
mode: one-shot's rows in pairs and an odd last row), so the buffer halves and signal values carry over calls as on
a GPU. Prints one JSON line: per call, the largest difference of each rank's outputs from the reference, and
the pads.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

HIDDEN, DTYPE = 96, torch.bfloat16
SLAB_BYTES = 3 * HIDDEN * 2                       # three rows per program: 192 rows at most take the peer path
CALLS = [(5, 0), (1, 1), (600, 2), (9, 3), (130, 4), (128, 5), (192, 6), (70, 7), (200, 8)]    # (rows, seed)
MAX_ROWS = max(rows for rows, _ in CALLS)


def call_inputs(rows: int, seed: int, world: int):
    g = torch.Generator().manual_seed(seed)
    partial = [torch.randn(rows, HIDDEN, generator=g).to(DTYPE) for _ in range(world)]
    return partial, torch.randn(rows, HIDDEN, generator=g).to(DTYPE), torch.randn(HIDDEN, generator=g).to(DTYPE)


def rank_main(rank: int, world: int, two_shot_rows: int, buffers, pads, outputs) -> None:
    from triton_kernel_checks import patch_triton_interpreter
    patch_triton_interpreter()
    from atom_aot.distributed import peer_table
    from atom_aot.ops.triton.all_reduce_norm import all_reduce_add_rms_norm
    table = torch.tensor(peer_table.table_values(rank, SLAB_BYTES, [b.data_ptr() for b in buffers],
                                                 [p.data_ptr() for p in pads], two_shot_rows),
                         dtype=torch.int64)
    for call, (rows, seed) in enumerate(CALLS):
        partial, residual, weight = call_inputs(rows, seed, world)
        if peer_table.peer_path_taken(rows, HIDDEN * partial[0].element_size(), SLAB_BYTES):
            reduced = torch.full_like(partial[0], float("nan"))      # never read: the kernel sums the peers
        else:
            reduced = torch.stack([p.float() for p in partial]).sum(0).to(DTYPE)
        out, residual_out = all_reduce_add_rms_norm(partial[rank], reduced, residual, weight, table, 1e-6, world)
        outputs[call][rank, 0, :rows], outputs[call][rank, 1, :rows] = out, residual_out


def main(world: int, two_shot_rows: int) -> dict:
    from atom_aot.distributed import peer_table
    from triton_kernel_checks import all_reduce_norm_reference
    buffers = [torch.zeros(2 * peer_table.PROGRAMS * SLAB_BYTES, dtype=torch.uint8).share_memory_()
               for _ in range(world)]
    pads = [torch.zeros(peer_table.PROGRAMS * world, dtype=torch.int64).share_memory_() for _ in range(world)]
    outputs = [torch.full((world, 2, MAX_ROWS, HIDDEN), float("nan"), dtype=DTYPE).share_memory_() for _ in CALLS]
    context = mp.get_context("spawn")
    ranks = [context.Process(target=rank_main, args=(r, world, two_shot_rows, buffers, pads, outputs))
             for r in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(240)
    result = {"exit_codes": [p.exitcode for p in ranks], "calls": []}
    for call, (rows, seed) in enumerate(CALLS):
        expected, summed = all_reduce_norm_reference(*call_inputs(rows, seed, world), 1e-6)
        peer = peer_table.peer_path_taken(rows, HIDDEN * 2, SLAB_BYTES)
        result["calls"].append({"rows": rows, "peer": peer,
                                "two_shot": peer and peer_table.two_shot_taken(rows, two_shot_rows),
                                "out": [(o[0, :rows].float() - expected.float()).abs().max().item() for o in outputs[call]],
                                "residual": [(o[1, :rows].float() - summed.float()).abs().max().item()
                                             for o in outputs[call]]})
    result["pads"] = [p.tolist() for p in pads]
    return result


if __name__ == "__main__":
    from atom_aot.distributed.peer_table import two_shot_rows_for
    world = int(sys.argv[1])
    print(json.dumps(main(world, 0 if sys.argv[2:] == ["one-shot"] else two_shot_rows_for(world))))
