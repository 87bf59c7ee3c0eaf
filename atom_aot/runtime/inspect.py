"""`atom-run ART inspect`: the manifest in human-readable form."""
from __future__ import annotations

from atom_aot.artifact.build_options import drawn_at_load, random_weights
from atom_aot.artifact.kv_cache import KVCacheSpec
from atom_aot.artifact.layout import CONFIG
from atom_aot.artifact.manifest import Manifest, Quantization
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.reader import Artifact
from atom_aot.distributed.symmetric_all_reduce import describe_plan
from atom_aot.models import ModelConfig, model_class
from atom_aot.runtime.sampling.sampler import masks_path

WEIGHT_ORIGINS = {"none": "not quantized", "build": "quantized by atom-build --quant",
                  "checkpoint": "from the checkpoint"}
DRAWN_MEMBER_NOTE = "  (no model weights: only what a draw at load cannot reproduce, e.g. calibrated kv scales)"


EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")     # config.json's, by family


def quantization_rows(q: Quantization, kv_cache: KVCacheSpec) -> list[tuple[str, str]]:
    """The weights' scheme with its origin, per layer group, and the KV cache's dtype, scales and layout."""
    origin = WEIGHT_ORIGINS[q.weights_origin] + (f" {q.weights}" if q.weights_origin == "build" else "")
    if q.checkpoint_format:
        origin += f": {q.checkpoint_format}" + (f"; ignored {', '.join(q.ignored)}" if q.ignored else "")
    layout = kv_cache.layout
    kv = kv_cache.describe() + (f"; per rank {layout.num_layers} layers x {layout.parts} x {layout.heads} heads x "
                                f"{layout.dim}" if layout else "")
    return [("weights", f"{q.weights} ({origin})"),
            ("groups", ", ".join(f"{group} {scheme}" for group, scheme in q.groups.items())),
            ("kv cache", kv)]


def weights_note(load_format: str) -> str:
    """What the model row says of random weights, and whether the artifact holds them."""
    if drawn_at_load(load_format):
        return f" - RANDOM weights, not stored: drawn on the device at every load (--load-format {load_format})"
    return f" - RANDOM weights (--load-format {load_format})" if random_weights(load_format) else ""


def mtp_rows(manifest: Manifest, config: dict) -> list[tuple[str, str]]:
    """The MTP layers config.json declares and whether the artifact holds them (build/mtp_layers.py); none for
    a model without any."""
    declared = ModelConfig.from_hf_dict(config).num_nextn_predict_layers
    built = manifest.model.mtp_layers
    if not declared:
        return []
    if not model_class(manifest.model.architecture).BUILDS_MTP_LAYERS:
        return [("mtp layers", f"not built: config.json has num_nextn_predict_layers={declared}, and atom-aot does not "
                               f"build {manifest.model.architecture}'s MTP layers (--method mtp is refused)")]
    if built is None or built == declared:
        return [("mtp layers", f"{declared} (MTP cache layers in the KV cache; --method mtp serves them)")]
    field = model_class(manifest.model.architecture).MTP_CONFIG_FIELD
    return [("mtp layers", f"none: config.json has {field}={declared}, but the checkpoint has no MTP tensors, so the "
                           f"artifact was built without them (no MTP cache layer, no mtp package; --method mtp is "
                           f"refused, --method ngram / draft work)")]


def describe(art: Artifact) -> str:
    m = art.manifest
    model, target, numerics, layout = m.model, m.target, m.numerics, m.layout
    config = art.read_json(CONFIG)
    tuning = art.read_tuning()
    graphs = art.read_graph_plan()
    rows = [
        ("artifact", f"{art.path} (format {m.format_version}, engine {m.engine_version}, "
                     f"forward signature {m.signature_version})"),
        ("build key", m.build_key),
        ("model", f"{model.name} ({model.architecture}), from {model.source}" + weights_note(m.options.load_format)),
        ("shape", f"{config.get('num_hidden_layers')} layers, hidden {config.get('hidden_size')}, "
                  f"heads {config.get('num_attention_heads')}/{config.get('num_key_value_heads')} (q/kv), "
                  f"vocab {config.get('vocab_size')}"),
        *mtp_rows(m, config),
        ("target", f"{target.arch}; torch {target.torch}, triton {target.triton}, cuda {target.cuda}, "
                   f"hip {target.hip}, cpu isa {target.cpu_isa}"),
        ("layout", f"tp {layout.tensor_parallel_size}, ep {layout.expert_parallel_size}, "
                   f"dp {layout.data_parallel_size} (world {layout.world_size})"),
        *([("all-reduce", describe_plan(layout.world_size))] if layout.world_size > 1 else []),
        ("numerics", f"dtype {numerics.dtype}, kv cache {m.kv_cache.dtype}"),
        *quantization_rows(m.quantization, m.kv_cache),
        *([("experts", m.quantization.experts)] if any(config.get(k) for k in EXPERT_COUNTS) else []),
        ("limits", f"max model len {numerics.max_model_len}, block size {numerics.block_size}"),
        ("compiled", "AOTInductor packages " + ", ".join(f"{p}: {v}" for p, v in m.compiled.packages.items())
                     if m.compiled.kind == "aotinductor"
                     else "none: the runtime runs the model module eagerly (built with --compile none)"),
        ("sampling", "top-p / min-p masks by " + masks_path(Phase.SAMPLE in m.compiled.packages)),
        ("cuda graphs", ", ".join(map(str, graphs.capture_sizes)) or graphs.note),
        ("built", f"{m.built_at} on {m.build_host} in "
                  + ", ".join(f"{k} {v:.1f}s" for k, v in m.build_seconds.items())),
        ("rebuild", m.rebuild_command()),
    ]
    lines = [f"{k:<12} {v}" for k, v in rows]
    lines.append("kernels" + (" (measured at build)" if tuning.measured else ""))
    for op, choice in tuning.kernels.items():
        lines.append(f"  {op:<22} {choice}")
    for phase, row in tuning.phases.items():
        ops = ", ".join(f"{op}: {c.backend}" + "".join(f" {k}={list(v)}" for k, v in c.params.items())
                        for op, c in row.ops.items())
        lines.append(f"  {phase.value + ' phase':<22} {ops}")
    lines.append("members")
    drawn = drawn_at_load(m.options.load_format)     # its weights members' sizes are not the model's
    for name, member in sorted(m.members.items()):
        stored = f", stored zstd {member.stored_size / 2**20:.2f} MiB" if member.stored == "zstd" else ""
        note = DRAWN_MEMBER_NOTE if drawn and name.startswith("weights/") else ""
        lines.append(f"  {name:<40} {member.size / 2**20:9.2f} MiB{stored}  sha256 {member.sha256[:16]}{note}")
    return "\n".join(lines)


def measurement_lines(measurements: dict, top: int = 4) -> list[str]:
    """tuning.json's build-time timings, one line per timed shape: its `top` fastest candidates in ms
    (a candidate the GPU could not launch shows as -). Walks the free-form tree down to the dicts that
    map candidates to times, so every op's table reads the same way."""
    lines = []

    def walk(path: list[str], node) -> None:
        timings = {k: v for k, v in node.items() if isinstance(v, (int, float)) or v is None}
        if timings and len(timings) == len(node):
            ranked = sorted(timings.items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0))
            shown = ", ".join(f"{c}: {'-' if ms is None else f'{ms:.4f}'}" for c, ms in ranked[:top])
            more = f" (+{len(ranked) - top} more)" if len(ranked) > top else ""
            lines.append(f"  {' / '.join(path):<40} {shown}{more}")
            return
        for key, value in node.items():
            if isinstance(value, dict):
                walk(path + [str(key)], value)
            else:
                lines.append(f"  {' / '.join(path + [str(key)]):<40} {value}")

    walk([], measurements)
    return lines or ["  nothing was timed (one implementation per op on this target)"]
