"""From the runtime config's speculative options to the proposer and verifying runner an engine
core runs with (None without --method)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from atom_aot.artifact.phase import Phase
from atom_aot.errors import StartupError
from atom_aot.runtime.block_manager import BlockManager
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.forwards import Forwards
from atom_aot.runtime.kv_cache import allocate_kv_cache
from atom_aot.runtime.loader import LoadedArtifact, load_artifact
from atom_aot.runtime.model_runner import ModelRunner
from atom_aot.runtime.sampler import Sampler
from atom_aot.runtime.verify_graphs import VerifyGraphs, verify_capture_sizes
from atom_aot.spec.draft import DraftModelProposer
from atom_aot.spec.mtp import HiddenTap, MTPProposer
from atom_aot.spec.ngram import NgramProposer
from atom_aot.spec.proposer import Proposer
from atom_aot.spec.stats import SpecCounters
from atom_aot.spec.verifier import SpeculativeRunner, VerifyForward

log = logging.getLogger("atom_aot")


@dataclass(frozen=True)
class Speculation:
    proposer: Proposer
    runner: SpeculativeRunner


def start_speculation(loaded: LoadedArtifact, config: RuntimeConfig, runner: ModelRunner, max_model_len: int,
                      num_kv_blocks: int, max_num_seqs: int, draft: LoadedArtifact | None = None) -> Speculation | None:
    """`draft`: the --method draft model, loaded (load_draft) before the target's KV pool was sized."""
    if config.method is None:
        return None
    k = config.num_speculative_tokens
    if config.method == "mtp":
        proposer = start_mtp(loaded, runner, k)
    elif config.method == "ngram":
        proposer = NgramProposer(k, config.ngram_min_n, config.ngram_max_n)
    else:
        proposer = start_draft(draft, config, num_kv_blocks * loaded.block_size, max_num_seqs)
    log.info("speculative decoding: %s proposer, %d draft tokens per step; verify steps run synchronously "
             "(async scheduling is off)", config.method, k)
    observer = proposer if isinstance(proposer, MTPProposer) else None
    verify = start_verify_graphs(loaded, config, runner, max_model_len, observer.tap if observer else None)
    return Speculation(proposer, SpeculativeRunner(runner, SpecCounters(config.method, k), observer, verify))


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


def start_mtp(loaded: LoadedArtifact, runner: ModelRunner, k: int) -> MTPProposer:
    """The model's MTP layer on the target's KV cache (its last cache layer). The runner's mixed
    forward becomes a tap that keeps the hidden states the MTP layer reads."""
    check_mtp(loaded)
    tap = HiddenTap(loaded.forwards[Phase.MIXED].logits_and_hidden)
    runner.forwards = replace(runner.forwards, mixed=tap)      # prefill and verify steps run `mixed`
    return MTPProposer(loaded.forwards[Phase.MTP], tap, runner.kv_cache, runner.block_size, runner.device, k)


def no_verify_graphs_reason(loaded: LoadedArtifact, config: RuntimeConfig, sizes: tuple[int, ...]) -> str | None:
    """Why verify steps cannot run as CUDA graphs here (None: they can)."""
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
    """A model with MTP layers, in an artifact whose packages give what the proposer needs."""
    layers = loaded.hf_config.get("num_nextn_predict_layers") or 0
    name = loaded.manifest.model.name
    if not layers:
        raise StartupError(f"--method mtp needs a model with MTP layers, and {name} "
                           f"({loaded.manifest.model.architecture}) has none (its config's num_nextn_predict_layers "
                           f"is {layers}). Use --method ngram, or --method draft --draft-model ARTIFACT.")
    mixed = loaded.forwards[Phase.MIXED]
    if Phase.MTP not in loaded.forwards or not getattr(mixed, "returns_hidden", True):
        lacks = ("no `mtp` package" if Phase.MTP not in loaded.forwards
                 else "a mixed package that does not return the hidden states the MTP layer reads")
        raise StartupError(f"--method mtp: {loaded.path} ({name}, {layers} MTP layer(s)) was built with {lacks} "
                           f"(an older atom-build). Rebuild it with: {loaded.manifest.rebuild_command()} ; or serve "
                           f"it with --enforce-eager, or use --method ngram.")


def load_draft(target: LoadedArtifact, config: RuntimeConfig, max_model_len: int) -> LoadedArtifact | None:
    """The --method draft model on the target's device (None without it), checked against the target. Loaded
    before the target's KV pool is sized, so that its weights are counted and its pool gets its share."""
    if config.method != "draft":
        return None
    draft = load_artifact(config.draft_model, enforce_eager=config.enforce_eager)
    check_draft(target, draft, max_model_len)
    return draft


def draft_kv_blocks(draft_block_size: int, target_tokens: int, max_num_seqs: int) -> int:
    """Blocks of a draft pool that holds every token the target's does (plus one block per sequence
    for a different block size's rounding)."""
    return -(-target_tokens // draft_block_size) + max_num_seqs


def start_draft(draft: LoadedArtifact, config: RuntimeConfig, target_tokens: int,
                max_num_seqs: int) -> DraftModelProposer:
    """The loaded draft model with a KV pool of its own (draft_kv_blocks)."""
    num_blocks = draft_kv_blocks(draft.block_size, target_tokens, max_num_seqs)
    kv_cache = allocate_kv_cache(draft.model_config, num_blocks, draft.block_size, draft.kv_dtype, draft.device)
    forwards = Forwards(draft.forwards[Phase.MIXED], draft.forwards.get(Phase.DECODE))
    runner = ModelRunner(forwards, kv_cache, draft.block_size, draft.device, Sampler(draft.device, config.seed))
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
