"""The fused all-reduce + add + RMSNorm kernel's peer path with ranks as processes, on the CPU: run by
tests/test_all_reduce_norm.py as `python tests/all_reduce_norm_ranks.py WORLD MODE...`, in Triton's interpreter.

Each rank is a spawned process running the kernel on its own partial sums; their buffers and signal pads are
shared CPU memory, each rank's peer table holding the addresses at which its process maps them, as peer-mapped
GPU memory would be. The calls alternate between messages that take the peer path and ones too large for the
slabs (summed before the kernel), and in mode `two-shot` between one-shot and two-shot sums
(peer_table.two_shot_rows_for the world size: from 2 rows per program on 2 ranks, 3 on 3; in mode `one-shot`,
never two-shot, the default mode: one-shot's rows in pairs and an odd last row), so the buffer halves and signal
values carry over calls as on a GPU. The same rank processes run each MODE's calls in turn, over buffers and pads of
its own (a spawned rank's imports cost about as much as a mode's calls). Prints one JSON line: the ranks' exit
codes and per mode, per call, the largest difference of each rank's outputs from the reference, and the pads.
"""
from __future__ import annotations

import json
import os
import sys
import time
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


def sleep_while_polling() -> None:
    """A rank polling its pads for a peer's signal sleeps between polls: the ranks outnumber the cores, and a poll
    spinning in the interpreter held the core that the peer it waited for needed (each program meets its peers)."""
    from triton.runtime import interpreter
    atomic = interpreter.InterpreterBuilder.create_atomic_rmw

    def create_atomic_rmw(self, *args):
        time.sleep(0.0002)
        return atomic(self, *args)
    interpreter.InterpreterBuilder.create_atomic_rmw = create_atomic_rmw


def rank_main(rank: int, world: int, modes: list[tuple], outputs) -> None:
    """`modes`: (two_shot_rows, buffers, pads) each, `outputs` a list per mode."""
    from triton_kernel_checks import patch_triton_interpreter
    patch_triton_interpreter()
    sleep_while_polling()
    from atom_aot.distributed import peer_table
    from atom_aot.ops.triton.all_reduce_norm import all_reduce_add_rms_norm
    for (two_shot_rows, buffers, pads), mode_outputs in zip(modes, outputs):
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
            mode_outputs[call][rank, 0, :rows], mode_outputs[call][rank, 1, :rows] = out, residual_out


def shared_memory(world: int, two_shot_rows: int) -> tuple:
    """(two_shot_rows, buffers, pads) of one mode: every rank's slab buffer and signal pad."""
    from atom_aot.distributed import peer_table
    buffers = [torch.zeros(2 * peer_table.PROGRAMS * SLAB_BYTES, dtype=torch.uint8).share_memory_()
               for _ in range(world)]
    pads = [torch.zeros(peer_table.PROGRAMS * world, dtype=torch.int64).share_memory_() for _ in range(world)]
    return two_shot_rows, buffers, pads


def main(world: int, two_shot_rows: dict[str, int]) -> dict:
    """`two_shot_rows`: mode -> the table's two-shot bound in that mode."""
    from atom_aot.distributed import peer_table
    from triton_kernel_checks import all_reduce_norm_reference
    modes = [shared_memory(world, rows) for rows in two_shot_rows.values()]
    outputs = [[torch.full((world, 2, MAX_ROWS, HIDDEN), float("nan"), dtype=DTYPE).share_memory_() for _ in CALLS]
               for _ in modes]
    context = mp.get_context("spawn")
    ranks = [context.Process(target=rank_main, args=(r, world, modes, outputs)) for r in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(240 * len(modes))
    result = {"exit_codes": [p.exitcode for p in ranks], "modes": {}}
    for name, (rows_for_two_shot, _, pads), mode_outputs in zip(two_shot_rows, modes, outputs):
        calls = []
        for call, (rows, seed) in enumerate(CALLS):
            expected, summed = all_reduce_norm_reference(*call_inputs(rows, seed, world), 1e-6)
            peer = peer_table.peer_path_taken(rows, HIDDEN * 2, SLAB_BYTES)
            calls.append({"rows": rows, "peer": peer,
                          "two_shot": peer and peer_table.two_shot_taken(rows, rows_for_two_shot),
                          "out": [(o[0, :rows].float() - expected.float()).abs().max().item()
                                  for o in mode_outputs[call]],
                          "residual": [(o[1, :rows].float() - summed.float()).abs().max().item()
                                       for o in mode_outputs[call]]})
        result["modes"][name] = {"calls": calls, "pads": [p.tolist() for p in pads]}
    return result


if __name__ == "__main__":
    from atom_aot.distributed.peer_table import two_shot_rows_for
    world = int(sys.argv[1])
    bounds = {"two-shot": two_shot_rows_for(world), "one-shot": 0}
    print(json.dumps(main(world, {mode: bounds[mode] for mode in sys.argv[2:]})))
