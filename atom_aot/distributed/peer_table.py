"""The peer table: what the fused all-reduce + residual add + RMSNorm kernel reads to reach the other ranks'
buffers (atom_aot/ops/triton/all_reduce_norm.py), and the rule for when it does.

It is a constant of a tensor-parallel GPU package (`model.all_reduce_peers`), filled by the runtime, never by
the build: int64 [rank, slab_bytes, the buffer address of each rank (MAX_RANKS slots), the signal pad address
of each rank (MAX_RANKS slots), two_shot_rows]. slab_bytes 0 means no peer memory: the graph's all-reduce before
the kernel sums the message (NCCL, or the two-shot kernel), and the kernel only adds and normalizes.
two_shot_rows: from how many rows per program the kernel sums two-shot (each rank sums a share of the rows, the
others read those sums from it) instead of one-shot (every rank reads every row of every rank); 0: never. The entry
came last, so a package built before reads the entries it knows where they were. This module holds
no Triton and no CUDA: the CPU side (the rule, the table's layout) is testable anywhere.
"""
from __future__ import annotations

PROGRAMS = 64              # programs of a launch that may take the peer path; the buffer holds a slab for each
ROWS_PER_PROGRAM_MAX = 8   # rows one program stages at most: a launch of more rows runs one program per row
MAX_RANKS = 8              # ranks the table has room for (peer memory spans one host)
VECTOR_BYTES = 16          # the kernel reads peers' rows in 16-byte vectors: rows must be whole vectors
RANK, SLAB_BYTES, BUFFERS = 0, 1, 2
SIGNALS = BUFFERS + MAX_RANKS
TWO_SHOT_ROWS = SIGNALS + MAX_RANKS
TABLE_SIZE = TWO_SHOT_ROWS + 1
BUFFER_NAME = "all_reduce_peers"     # the model's buffer, and so the package constant's last name


def peer_path_taken(rows: int, row_bytes: int, slab_bytes: int) -> bool:
    """Whether `rows` rows of `row_bytes` sum over peer memory inside the kernel, with the table's slab_bytes.
    The kernel decides by the same rule from the same numbers, and the all-reduce before it skips the message
    exactly then (atom::all_reduce_unless_fused)."""
    per_program = -(-rows // PROGRAMS)
    return (slab_bytes > 0 and row_bytes % VECTOR_BYTES == 0 and per_program <= ROWS_PER_PROGRAM_MAX
            and per_program * row_bytes <= slab_bytes)


MIN_SLAB_BYTES = 32 << 10  # 4 rows of hidden 4096 in bf16 per program: a decode batch of 256 (measured on H200s)


def slab_bytes_for(one_shot_max_bytes: int) -> int:
    """Each program's slab in a buffer half: the one-shot bound spread over the programs (whole vectors), and at
    least MIN_SLAB_BYTES, so that small batches take the fused kernel at any world size (four ranks' one-shot
    bound, 256 KiB, is 4 KiB per program: less than one 4096-wide bf16 row). 32 KiB against 16 KiB: Llama-3.1-8B
    throughput at batch 256 +3.1% at -tp 2, +2.0% at -tp 4 (four H200s)."""
    return max(one_shot_max_bytes // PROGRAMS // VECTOR_BYTES * VECTOR_BYTES, MIN_SLAB_BYTES)


def two_shot_rows_for(world_size: int) -> int:
    """Two-shot once every rank has a row of each program's to sum (fewer rows would leave ranks idle while the
    others read and write for them, after two meetings instead of one)."""
    return world_size


def two_shot_taken(rows: int, two_shot_rows: int) -> bool:
    """Whether a message of `rows` rows that takes the peer path sums two-shot (the kernel's rule)."""
    return 0 < two_shot_rows <= -(-rows // PROGRAMS)


def table_values(rank: int, slab_bytes: int, buffers: list[int], signals: list[int],
                 two_shot_rows: int = 0) -> list[int]:
    """The table's entries (addresses as the process maps them; empty slots 0)."""
    if len(buffers) != len(signals) or len(buffers) > MAX_RANKS:
        raise ValueError(f"a peer table holds up to {MAX_RANKS} ranks' buffers and signal pads, got "
                         f"{len(buffers)} and {len(signals)}")
    pad = [0] * (MAX_RANKS - len(buffers))
    return [rank, slab_bytes, *buffers, *pad, *signals, *pad, two_shot_rows]


def empty_table() -> list[int]:
    """No peer memory: every message is summed before the kernel."""
    return [0] * TABLE_SIZE
