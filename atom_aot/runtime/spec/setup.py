"""From the runtime config's speculative options to the proposer and verifying runner an engine
core runs with (None without --method)."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Callable

from atom_aot.artifact.phase import Phase
from atom_aot.errors import StartupError
from atom_aot.models import ModelConfig, model_class
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.execution.forwards import Forwards
from atom_aot.runtime.execution.kv_cache import allocate_kv_cache
from atom_aot.runtime.execution.memory import draft_kv_blocks, uses_graphs, widest_row_bytes
from atom_aot.runtime.execution.model_runner import ModelRunner
from atom_aot.runtime.loading.loader import LoadedArtifact, load_artifact
from atom_aot.runtime.outputs import SpecCounters
from atom_aot.runtime.sampling.sampler import Sampler
from atom_aot.runtime.scheduling.block_manager import BlockManager
from atom_aot.runtime.scheduling.scheduler import SpeculationShape
from atom_aot.runtime.spec.draft import DraftModelProposer
from atom_aot.runtime.spec.mtp import HiddenTap, MTPForward, MTPProposer
from atom_aot.runtime.spec.mtp_graphs import MTPGraphs
from atom_aot.runtime.spec.ngram import NgramProposer
from atom_aot.runtime.spec.proposer import Proposer
from atom_aot.runtime.spec.verifier import SpeculativeRunner, VerifyForward
from atom_aot.runtime.spec.verify_graphs import MAX_GRAPH_TOKENS, VerifyGraphs, verify_capture_sizes
from atom_aot.runtime.spec.verify_rows import DecodeRowsVerify

log = logging.getLogger("atom_aot")

# How an MTP step reaches a model's other ranks: the step's forward wrapped (runtime/parallel/: rank 0 sends it to
# the tensor-parallel ranks first; a data-parallel-attention rank agrees its size with the others' and pads)
PeersMTP = Callable[[MTPForward], MTPForward]

# Which route verify steps take: decode rows (runtime/spec/verify_rows.py) or the mixed package (with its own
# verify graphs, runtime/spec/verify_graphs.py); `auto` (default) picks by the artifact (verify_route).
VERIFY_ROUTE_VARIABLE = "ATOM_VERIFY_ROUTE"
DECODE_ROWS, MIXED_ROUTE = "decode-rows", "mixed"
VERIFY_ROUTES = (DECODE_ROWS, MIXED_ROUTE)


@dataclass(frozen=True)
class Speculation:
    proposer: Proposer
    runner: SpeculativeRunner

    @property
    def shape(self) -> SpeculationShape:
        """What the scheduler needs to know of it."""
        return SpeculationShape(self.proposer.num_speculative_tokens, self.proposer.lookahead_slots,
                                verify_every_decode=not self.proposer.decodes_without_drafts)


def tap_hidden(loaded: LoadedArtifact, config: RuntimeConfig, forwards: Forwards) -> tuple[Forwards, HiddenTap | None]:
    """For --method mtp: this rank's forwards keeping the hidden states the MTP layer reads (runtime/spec/mtp.py
    HiddenTap), from both packages: prefill steps run the mixed one, verify steps as decode rows the decode one.
    Tapped before the ranks' links wrap them (rank 0 leading the others, or the data-parallel ranks' alignment),
    so every layout keeps them the same way. `forwards` as they are, and no tap, without --method mtp."""
    if config.method != "mtp":
        return forwards, None
    check_mtp(loaded)
    tap = HiddenTap(forwards.mixed.logits_and_hidden)
    decode = None if forwards.decode is None else tap.tapping(forwards.decode.logits_and_hidden)
    return replace(forwards, mixed=tap.tapping(tap.logits_and_hidden), decode=decode), tap


def start_speculation(loaded: LoadedArtifact, config: RuntimeConfig, runner: ModelRunner, max_model_len: int,
                      num_kv_blocks: int, max_num_seqs: int, draft: LoadedArtifact | None = None,
                      tap: HiddenTap | None = None, peers_mtp: PeersMTP | None = None) -> Speculation | None:
    """`draft`: the --method draft model, loaded (load_draft) before the target's KV pool was sized; `tap`: the
    hidden states of the runner's forwards (tap_hidden), for --method mtp; `peers_mtp`: how an MTP step reaches the
    model's other ranks (rank 0 sends it to the tensor-parallel ranks; a data-parallel rank aligns it with the
    others'), None on one rank."""
    if config.method is None:
        return None
    k = config.num_speculative_tokens
    if config.method == "mtp":
        if tap is None:
            raise ValueError("--method mtp needs the runner's forwards tapped for their hidden states (tap_hidden)")
        proposer = start_mtp(loaded, runner, tap, k, max_model_len, peers_mtp)
    elif config.method == "ngram":
        proposer = NgramProposer(k, config.ngram_min_n, config.ngram_max_n)
    else:
        proposer = start_draft(draft, config, num_kv_blocks * loaded.block_size, max_num_seqs)
    log.info("speculative decoding: %s proposer, %d draft tokens per step; verify steps run synchronously "
             "(async scheduling is off)", config.method, k)
    observer = proposer if isinstance(proposer, MTPProposer) else None
    route, why = verify_route(loaded)
    verify = (start_decode_rows(runner, why) if route == DECODE_ROWS
              else start_verify_graphs(loaded, config, runner, max_model_len, tap))
    return Speculation(proposer, SpeculativeRunner(runner, SpecCounters(config.method, k), proposer, max_model_len,
                                                   observer, verify))


def verify_route(loaded: LoadedArtifact) -> tuple[str, str]:
    """How verify steps run, and why: DECODE_ROWS (runtime/spec/verify_rows.py) where the mixed package cannot be
    captured and for MLA models, else MIXED (the mixed package, as CUDA graphs where it can be); ATOM_VERIFY_ROUTE
    decides instead."""
    forced = os.environ.get(VERIFY_ROUTE_VARIABLE, "auto")
    if forced not in (*VERIFY_ROUTES, "auto"):
        raise StartupError(f"{VERIFY_ROUTE_VARIABLE}={forced!r}: use one of auto, {', '.join(VERIFY_ROUTES)}")
    if forced != "auto":
        return forced, f"{VERIFY_ROUTE_VARIABLE}={forced}"
    mla = loaded.tuning.for_phase(Phase.MIXED).ops.get("mla_attention")
    if mla is not None and mla.backend == "reference":
        return DECODE_ROWS, "the mixed package's MLA is the reference op, which reads the batch layout on the host"
    if mla is not None:       # measured on an H200 with the reference op only (docs/speculative.md)
        return DECODE_ROWS, ("MLA: each verify token through the decode kernel in the decode graphs; the mixed "
                             f"package's verify graphs are not measured against them ({VERIFY_ROUTE_VARIABLE}="
                             f"{MIXED_ROUTE} takes them)")
    return MIXED_ROUTE, "the mixed package attends over several query tokens per sequence"


def start_decode_rows(runner: ModelRunner, why: str) -> VerifyForward:
    """Verify steps through the decode forward (its CUDA graphs where it has them), one row per query token;
    where the artifact has no decode package, the mixed one runs the rows. The runner's forwards are the ones
    the tap keeps hidden states of (tap_hidden) and that reach the other ranks, if any."""
    forwards = runner.forwards
    decode = forwards.decode if forwards.decode is not None else forwards.mixed
    graphs = forwards.decode_max_seqs
    log.info("verify steps: %s, one decode row per query token (%s)%s",
             "CUDA graphs of the decode package" if graphs else
             "the decode package" if forwards.decode is not None else "the mixed package", why,
             f"; verify batches of more than {graphs} rows run the mixed package" if graphs else "")
    return DecodeRowsVerify(decode, graphs, forwards.mixed)


def start_verify_graphs(loaded: LoadedArtifact, config: RuntimeConfig, runner: ModelRunner, max_model_len: int,
                        tap: HiddenTap | None) -> VerifyForward | None:
    """Verify steps as CUDA graphs of the mixed package (K+1 rows per sequence) where the decode steps
    have graphs (a CUDA device, not enforce_eager) and the model runs on one rank; None: the mixed
    package runs them as it is. The startup log says which."""
    k = config.num_speculative_tokens
    sizes = verify_capture_sizes(loaded.graph_plan.capture_sizes, k)
    reason = no_verify_graphs_reason(loaded, config, sizes)
    if reason is not None:
        log.info("verify steps: the mixed package, no CUDA graphs (%s)", reason)
        return None
    mixed = runner.forwards.mixed
    graphs = VerifyGraphs(tap.logits_and_hidden if tap else mixed, runner.kv_cache, sizes, k,
                          -(-max_model_len // loaded.block_size), loaded.block_size)
    start = time.perf_counter()
    try:
        graphs.capture()
    except RuntimeError as e:     # a mixed package that cannot be captured (the build probes only the decode one)
        log.warning("verify steps: the mixed package, no CUDA graphs (capturing it at %d rows per sequence failed: "
                    "%s)", k + 1, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None
    loaded.timings["verify graph capture"] = time.perf_counter() - start
    log.info("verify steps: CUDA graphs of the mixed package at %d rows per sequence, %d sizes up to %d sequences "
             "captured in %.2fs; larger verify batches run the package as it is", k + 1, len(sizes),
             graphs.max_batch_size, loaded.timings["verify graph capture"])

    def verify(inputs, counts):
        if len(counts) > graphs.max_batch_size:
            return mixed(inputs)
        out = graphs(inputs, counts)
        if tap is None:
            return out
        tap.hidden = out[1]
        return out[0]
    return verify


def start_mtp(loaded: LoadedArtifact, runner: ModelRunner, tap: HiddenTap, k: int, max_model_len: int,
              peers_mtp: PeersMTP | None) -> MTPProposer:
    """The model's MTP layer on the target's KV cache (its last cache layer), reading the hidden states `tap` keeps
    of the runner's forwards (tap_hidden), its steps sent to or aligned with the other ranks by `peers_mtp`."""
    mtp = mtp_forward(loaded, runner.kv_cache, runner.forwards.decode_max_seqs is not None, max_model_len)
    if peers_mtp is not None:
        mtp = peers_mtp(mtp)
    return MTPProposer(mtp, tap, runner.kv_cache, runner.block_size, runner.device, k)


def mtp_forward(loaded: LoadedArtifact, kv_cache, with_graphs: bool, max_model_len: int) -> MTPForward:
    """The `mtp` package, replayed as CUDA graphs at the decode steps' capture sizes where the decode steps have
    graphs (`with_graphs`; runtime/spec/mtp_graphs.py). Every rank of a model makes the same choice and captures
    the same sizes in the same order after its decode graphs, so the collectives inside the captures meet."""
    mtp = loaded.forwards[Phase.MTP]
    if not with_graphs:
        log.info("MTP step: the mtp package as it is (no decode CUDA graphs here)")
        return mtp
    start = time.perf_counter()
    graphs = MTPGraphs(mtp, kv_cache, loaded.graph_plan.capture_sizes, -(-max_model_len // loaded.block_size),
                       loaded.model_config.hidden_size, loaded.dtype)
    graphs.capture()
    loaded.timings["mtp graph capture"] = time.perf_counter() - start
    log.info("MTP step: CUDA graphs of the mtp package, %d sizes up to %d rows captured in %.2fs; larger steps "
             "run the package as it is", len(loaded.graph_plan.capture_sizes), graphs.max_batch_size,
             loaded.timings["mtp graph capture"])
    return graphs


def no_verify_graphs_reason(loaded: LoadedArtifact, config: RuntimeConfig, sizes: tuple[int, ...]) -> str | None:
    """Why verify steps cannot run as CUDA graphs of the mixed package here (None: they can)."""
    if verify_route(loaded)[0] != MIXED_ROUTE:
        return "verify steps run as decode rows"
    if loaded.device.type != "cuda":
        return "not a CUDA device"
    if config.enforce_eager:
        return "enforce_eager"
    if loaded.manifest.layout.world_size > 1:     # the other ranks follow rank 0's steps at their real shapes
        return f"{loaded.manifest.layout.world_size} ranks"
    if not sizes:
        return f"no capture size holds {config.num_speculative_tokens + 1} rows per sequence"
    return None


def check_mtp(loaded: LoadedArtifact) -> None:
    """A model with MTP layers, in an artifact that holds them and whose packages give what the proposer needs."""
    name, architecture = loaded.manifest.model.name, loaded.manifest.model.architecture
    declared = ModelConfig.from_hf_dict(loaded.hf_config).num_nextn_predict_layers
    if declared and not model_class(architecture).BUILDS_MTP_LAYERS:
        raise StartupError(f"--method mtp: {name} ({architecture}) is served without the {declared} MTP layer(s) of "
                           f"its checkpoint: atom-aot does not build the MTP layers of {architecture} (the build "
                           f"skipped them). Use --method ngram, or --method draft --draft-model ARTIFACT.")
    layers = loaded.model_config.num_nextn_predict_layers
    if not layers:
        raise StartupError(no_mtp_layers(loaded, declared))
    mixed = loaded.forwards[Phase.MIXED]
    if Phase.MTP not in loaded.forwards or not getattr(mixed, "returns_hidden", True):
        lacks = ("no `mtp` package" if Phase.MTP not in loaded.forwards
                 else "a mixed package that does not return the hidden states the MTP layer reads")
        raise StartupError(f"--method mtp: {loaded.path} ({name}, {layers} MTP layer(s)) was built with {lacks} "
                           f"(an older atom-build). Rebuild it with: {loaded.manifest.rebuild_command()} ; or serve "
                           f"it with --enforce-eager, or use --method ngram.")


def no_mtp_layers(loaded: LoadedArtifact, declared: int) -> str:
    """Why an artifact without MTP layers cannot serve --method mtp: its model has none, or its checkpoint had none
    of their tensors (the manifest's model.mtp_layers is 0 where config.json declares `declared`)."""
    model, others = loaded.manifest.model, "Use --method ngram, or --method draft --draft-model ARTIFACT."
    if not declared:
        return f"--method mtp needs a model with MTP layers, and {model.name} ({model.architecture}) has none. {others}"
    field = model_class(model.architecture).MTP_CONFIG_FIELD
    return (f"--method mtp needs the model's MTP layers, and {loaded.path} ({model.name}) was built without them: "
            f"its config.json has {field}={declared}, but the checkpoint it was built from has no MTP tensors (as "
            f"transformers' save_pretrained writes it). {others} For --method mtp, build it from a checkpoint that "
            f"holds the MTP layers (as DeepSeek ships it).")


def load_draft(target: LoadedArtifact, config: RuntimeConfig, max_model_len: int) -> LoadedArtifact | None:
    """The --method draft model on the target's device (None without it), checked against the target. Loaded
    before the target's KV pool is sized, so that its weights are counted and its pool gets its share."""
    if config.method != "draft":
        return None
    draft = load_artifact(config.draft_model, enforce_eager=config.enforce_eager, trusted_keys=config.trusted_keys)
    check_draft(target, draft, max_model_len)
    return draft


def start_draft(draft: LoadedArtifact, config: RuntimeConfig, target_tokens: int,
                max_num_seqs: int) -> DraftModelProposer:
    """The loaded draft model with a KV pool of its own (draft_kv_blocks)."""
    num_blocks = draft_kv_blocks(draft.block_size, target_tokens, max_num_seqs)
    kv_cache = allocate_kv_cache(draft.kv_cache, num_blocks, draft.block_size, draft.device)
    forwards = Forwards(draft.forwards[Phase.MIXED], draft.forwards.get(Phase.DECODE))
    sampler = Sampler.for_artifact(draft.forwards, draft.device, config.seed)
    runner = ModelRunner(forwards, kv_cache, draft.block_size, draft.device, sampler)
    log.info("draft model %s: %d KV blocks of %d tokens", draft.manifest.model.name, num_blocks, draft.block_size)
    return DraftModelProposer(runner, BlockManager(num_blocks, draft.block_size, enable_prefix_caching=False),
                              config.num_speculative_tokens)


def check_draft(target: LoadedArtifact, draft: LoadedArtifact, max_model_len: int) -> None:
    """Its tokens must mean the target's (the same tokenizer files) and reach as far."""
    ours, theirs = target.manifest.model, draft.manifest.model
    if ours.tokenizer_hash != theirs.tokenizer_hash:
        raise StartupError(f"the draft model {draft.path} ({theirs.name}) has another tokenizer than {ours.name} "
                           f"(tokenizer hash {theirs.tokenizer_hash[:12]} vs {ours.tokenizer_hash[:12]}): its token "
                           f"ids would mean other text. Use a draft model of the same family (same tokenizer).")
    if draft.max_model_len < max_model_len:
        raise StartupError(f"the draft model {draft.path} was built for sequences of up to {draft.max_model_len} "
                           f"tokens, fewer than the {max_model_len} served. Build it with atom-build "
                           f"--max-model-len {max_model_len}, or serve with --max-model-len {draft.max_model_len}.")
    if draft.device != target.device:
        raise StartupError(f"the draft model {draft.path} runs on {draft.device} but {ours.name} on "
                           f"{target.device}: build both for the same arch")


def verify_graph_reserve(loaded: LoadedArtifact, config: RuntimeConfig) -> int:
    """Bytes the speculative CUDA graphs' pools keep, each bounded like activation_reserve's at its largest
    token count: the mixed package's verify graphs (runtime/spec/verify_graphs.py) and the MTP step's
    (runtime/spec/mtp_graphs.py), where they are captured; 0 without them."""
    if config.method is None or not uses_graphs(loaded, config):
        return 0
    mtp = max(loaded.graph_plan.capture_sizes) * widest_row_bytes(loaded) if config.method == "mtp" else 0
    sizes = verify_capture_sizes(loaded.graph_plan.capture_sizes, config.num_speculative_tokens)
    if no_verify_graphs_reason(loaded, config, sizes) is not None:     # the same decision start_speculation makes
        return mtp
    return MAX_GRAPH_TOKENS * widest_row_bytes(loaded) + mtp
