"""The mixed row of an MLA (DeepSeek) model on a GPU arch, measured on the model's own attention shapes: the
triton mixed path's kernel configs, its prefix workspace (capacity and up-projection tile), the longest query run it
takes in the absorbed form, and whether that path beats the torch reference op at all (ops/backends/mla_mixed.py
says what the path runs). Each timing is the whole backend call of one layer (rope, cache write, up-projection
GEMMs, kernels) as the mixed package runs it, a CUDA graph replayed where it captures (the reference op, which reads
the batch on the host, is timed as it runs). build/tune_mla.py calls this."""
from __future__ import annotations

import logging
import math

import torch

from atom_aot.artifact.kv_cache import FP8_KV_CACHE_DTYPE
from atom_aot.artifact.tuning import BackendChoice, timings_json
from atom_aot.build.config import BuildConfig
from atom_aot.dtypes import torch_dtype
from atom_aot.models import ModelConfig
from atom_aot.ops.backends import make_backend
from atom_aot.ops.backends.base import AttentionInputs
from atom_aot.ops.backends.mla import MLAArgs

log = logging.getLogger("atom_aot")

# (sequences, new tokens each, cached tokens each): the chunk kernel is chosen on prefills without a prefix (8 x
# 1024 is a whole 8192-token step), the prefix kernel on chunks over cached prefixes taken absorbed (no workspace),
# the workspace's tile there with every prefix in it
CHUNK_SHAPES = ((1, 2048, 0), (8, 1024, 0))
PREFIX_SHAPES = ((1, 1024, 2048), (4, 512, 1024))
# the workspace's capacity: prefixes of 2048 to 16384 tokens in all (the smaller capacities overflow on the last
# ones), and a fresh prefill, which pays only the workspace kernel's empty grid
CAPACITY_SHAPES = ((1, 1024, 2048), (1, 2048, 4096), (2, 1024, 8192), (8, 1024, 0))
# a larger capacity within this factor of the best geometric mean is not worth its memory
CAPACITY_TOLERANCE = 1.05
WORKSPACE_MAX_BYTES = 1 << 30          # one layer call's workspace (freed after it; the KV cache gets the rest)
# query runs of these lengths (32 sequences over 2048 cached tokens), absorbed against naive: speculative
# verify steps and short chunks
RUN_LENGTHS = (2, 4, 8)
RUN_BATCH, RUN_CONTEXT = 32, 2048
REFERENCE_SHAPES = ((8, 1024, 0), (1, 1024, 2048), (1, 2048, 4096))


def shape_name(shape: tuple[int, int, int]) -> str:
    seqs, tokens, prefix = shape
    return f"{seqs}x{tokens}+{prefix}"


def tune_mixed(cfg: ModelConfig, config: BuildConfig, decode_params: dict, best) -> tuple[BackendChoice, dict, str]:
    """(the mixed row's mla_attention choice, the timings behind it, what runs, for inspect). `decode_params`:
    the decode row's `mla_decode@<first batch>` buckets, which the absorbed runs' rows use too; `best`: build/
    tune.py's pick of the config nearest every shape's fastest."""
    from atom_aot.ops.triton.mla_prefill import CHUNK_CANDIDATES, PREFIX_CANDIDATES
    from atom_aot.ops.triton.mla_workspace import ABSORBED_PREFIXES, WORKSPACE_CANDIDATES
    steps = MixedSteps(cfg, config)

    def params(chunk, prefix, workspace, runs: int) -> BackendChoice:
        return BackendChoice("triton", {**decode_params, "mla_chunk": chunk, "mla_prefix": prefix,
                                        "mla_prefix_workspace": workspace, "absorbed_runs": (runs,)})
    none = ABSORBED_PREFIXES.as_args()
    first_prefix = PREFIX_CANDIDATES[0].as_args()
    chunk_ms = _timings(steps, CHUNK_SHAPES, [c.as_args() for c in CHUNK_CANDIDATES],
                        lambda c: params(c, first_prefix, none, 1))
    chunk = best(chunk_ms)
    prefix_ms = _timings(steps, PREFIX_SHAPES, [c.as_args() for c in PREFIX_CANDIDATES],
                         lambda c: params(chunk, c, none, 1))
    prefix = best(prefix_ms)
    capacities = workspace_capacities(cfg, config)
    tiles = [(capacities[-1], *w.as_args()[1:]) for w in WORKSPACE_CANDIDATES]
    tile_ms = _timings(steps, PREFIX_SHAPES, tiles, lambda w: params(chunk, prefix, w, 1))
    tile = best(tile_ms)[1:]
    capacity_ms = _timings(steps, CAPACITY_SHAPES, [(c,) for c in (0, *capacities)],
                           lambda c: params(chunk, prefix, (*c, *tile), 1))
    workspace = (smallest_near_best(capacity_ms)[0], *tile)
    runs, runs_ms = _absorbed_runs(steps, lambda n: params(chunk, prefix, workspace, n))
    chosen = params(chunk, prefix, workspace, runs)
    against = {shape_name(s): {"triton": steps.time(s, chosen), "reference": steps.time(s, BackendChoice("reference"))}
               for s in REFERENCE_SHAPES}
    measurements = {"mla_chunk": timings_json(chunk_ms), "mla_prefix": timings_json(prefix_ms),
                    "mla_prefix_workspace": timings_json(tile_ms), "prefix_capacity": timings_json(capacity_ms),
                    "absorbed_runs": runs_ms, "against_reference": against,
                    "triton_in_cuda_graphs": not steps.uncaptured, "triton_choice": chosen.to_dict()}
    if steps.uncaptured:
        log.warning("tuning: the triton mixed MLA path did not capture in a CUDA graph at %s (timed as it ran)",
                    ", ".join(sorted(steps.uncaptured)))
    if _slowdown(against, "triton", "reference") > 1.0:
        log.info("tuning: the triton mixed MLA path is slower than the reference op (%s): the mixed row keeps the "
                 "reference", against)
        return BackendChoice("reference"), measurements, ("mixed: torch reference atom::mla_attention (naive prefill; "
                                                          "measured faster than the triton mixed path)")
    label = mixed_label(runs, chunk, prefix, workspace)
    log.info("tuning: MLA %s", label)
    return chosen, measurements, label


def mixed_label(runs: int, chunk: tuple, prefix: tuple, workspace: tuple) -> str:
    """What the triton mixed row runs, in words (inspect's kernels line, the start's log)."""
    if workspace[0] == 0:
        prefixes = (f"cached prefixes absorbed in the prefix kernel {list(prefix)} (no prefix workspace: measured "
                    f"faster without)")
    else:
        prefixes = (f"cached prefixes up-projected into a {workspace[0]}-token workspace (kernel "
                    f"{list(workspace[1:])}) and attended in the chunk kernel, what overflows it absorbed in the "
                    f"prefix kernel {list(prefix)}")
    return (f"mixed: triton, query runs of <= {runs} tokens absorbed (atom_triton::mla_decode, a row per token), "
            f"longer runs naive (atom_triton::mla_prefill: causal chunk kernel {list(chunk)}; {prefixes})")


def workspace_capacities(cfg: ModelConfig, config: BuildConfig) -> list[int]:
    """The candidate capacities (ascending, 0 left out) whose workspace at this rank's heads and the build's dtype
    stays within WORKSPACE_MAX_BYTES; at least the smallest."""
    from atom_aot.ops.triton.mla_workspace import CAPACITY_CANDIDATES, workspace_bytes
    ds, heads = cfg.deepseek, cfg.num_attention_heads // config.tensor_parallel_size
    size = config.torch_dtype.itemsize
    fits = [c for c in CAPACITY_CANDIDATES[1:] if workspace_bytes(c, heads, ds.qk_nope_head_dim, ds.v_head_dim,
                                                                 ds.qk_rope_head_dim, size) <= WORKSPACE_MAX_BYTES]
    return fits or [CAPACITY_CANDIDATES[1]]


def smallest_near_best(rows: dict, tolerance: float = CAPACITY_TOLERANCE) -> tuple[int, ...]:
    """Of configs that sort by size (capacities), the smallest whose geometric-mean slowdown against each shape's
    fastest is within `tolerance` of the best one's, among those timed at every shape (None: did not launch)."""
    rows = {shape: {c: ms for c, ms in row.items() if ms is not None} for shape, row in rows.items()}
    configs = sorted(set.intersection(*(set(row) for row in rows.values())))
    scores = {c: math.exp(sum(math.log(row[c] / min(row.values())) for row in rows.values()) / len(rows))
              for c in configs}
    least = min(scores.values())
    return next(c for c in configs if scores[c] <= least * tolerance)


def _timings(steps: "MixedSteps", shapes, candidates, choice) -> dict:
    """{shape: {candidate: ms}}: each candidate's row (`choice(candidate)`) timed at each shape."""
    return {shape_name(s): {c: steps.time(s, choice(c)) for c in candidates} for s in shapes}


def _absorbed_runs(steps: "MixedSteps", choice) -> tuple[int, dict]:
    """The longest query run (of RUN_LENGTHS, in order, while it keeps winning) that the absorbed form serves faster
    than the naive one; 1 (decoding tokens only) when it loses at the first. `choice(n)`: the row absorbing runs of
    up to n tokens."""
    runs, timings = 1, {}
    for length in RUN_LENGTHS:
        shape = (RUN_BATCH, length, RUN_CONTEXT - length)
        row = {"naive": steps.time(shape, choice(length - 1)), "absorbed": steps.time(shape, choice(length))}
        timings[str(length)] = row
        if None in row.values() or row["absorbed"] >= row["naive"]:
            break
        runs = length
    return runs, timings


def _slowdown(rows: dict, a: str, b: str) -> float:
    """Geometric mean over shapes of a's time over b's (None: a config that did not launch counts as slower)."""
    ratios = [row[a] / row[b] if row[a] is not None and row[b] else math.inf for row in rows.values()]
    return math.exp(sum(map(math.log, ratios)) / len(ratios))


class MixedSteps:
    """Random mixed steps at the model's MLA shapes (this rank's heads), one shape held at a time; `time` runs the
    backend a choice names on one: the triton path replayed from a CUDA graph (the shapes where it would not
    capture are kept in `uncaptured`), the reference op as it runs (its host reads cannot be captured)."""

    def __init__(self, cfg: ModelConfig, config: BuildConfig):
        self.cfg, self.config = cfg, config
        self.shape, self.args = None, None
        self.uncaptured: set[str] = set()

    def time(self, shape: tuple[int, int, int], choice: BackendChoice) -> float | None:
        import triton.testing
        from triton.runtime.errors import OutOfResources
        from atom_aot.ops.triton.timing import measure_ms
        if shape != self.shape:
            self.args, self.shape = None, None            # the last step's tensors go before the next's are drawn
            self.args, self.shape = self._step(*shape), shape
        backend, args = make_backend("mla_attention", choice), self.args
        if choice.backend == "reference":
            return triton.testing.do_bench(lambda: backend(args), return_mode="median")
        try:
            ms, captured = measure_ms(lambda: backend(args))
        except OutOfResources as e:
            log.info("tuning: %s does not fit this GPU (%s); not a candidate", choice.params, e)
            return None
        if not captured:
            self.uncaptured.add(shape_name(shape))
        return ms

    def _step(self, seqs: int, tokens: int, prefix: int) -> MLAArgs:
        return mixed_step(self.cfg, self.config, [prefix] * seqs, [tokens] * seqs)


def mixed_step(cfg: ModelConfig, config: BuildConfig, context_lens: list[int], query_lens: list[int],
               device: str = "cuda") -> MLAArgs:
    """One layer's call on a random step: sequence b has context_lens[b] cached latents and computes query_lens[b]
    tokens, at the model's MLA shapes (this rank's heads), in the build's dtypes (an fp8 cache with scales)."""
    from atom_aot.ops.triton.batch_inputs import make_paged_batch
    ds, dt, t = cfg.deepseek, config.torch_dtype, sum(query_lens)
    heads = cfg.num_attention_heads // config.tensor_parallel_size
    b = make_paged_batch(context_lens, query_lens, 1, ds.latent_dim, block_size=config.block_size, num_layers=1,
                         dtype=torch_dtype(config.kv_cache_element_dtype), device=device)
    fp8 = config.kv_cache_element_dtype == FP8_KV_CACHE_DTYPE

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dt)
    return MLAArgs(0, rand(t, heads, ds.qk_nope_head_dim), rand(t, heads, ds.qk_rope_head_dim),
                   rand(t, ds.kv_lora_rank), rand(t, ds.qk_rope_head_dim), b.positions,
                   torch.randn(max(c + n for c, n in zip(context_lens, query_lens)), ds.qk_rope_head_dim,
                               device=device),
                   rand(heads, ds.qk_nope_head_dim, ds.kv_lora_rank, scale=ds.kv_lora_rank ** -0.5),
                   rand(heads, ds.kv_lora_rank, ds.v_head_dim, scale=ds.kv_lora_rank ** -0.5),
                   ds.qk_head_dim ** -0.5,
                   AttentionInputs(b.kv_cache[:, :1], b.slot_mapping, b.block_tables, b.seq_lens, b.query_start_loc),
                   torch.tensor([0.01, 0.05], device=device) if fp8 else None)
