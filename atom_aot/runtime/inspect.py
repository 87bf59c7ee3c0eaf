"""`atom-run ART inspect`: the manifest in human-readable form."""
from __future__ import annotations

from atom_aot.runtime.artifact import Artifact


def describe(art: Artifact) -> str:
    m = art.manifest
    model, target, build = m["model"], m["target"], m["build"]
    config = art.read_json("config/config.json")
    tuning = art.read_json("tuning.json")
    graphs = art.read_json("graphs.json")
    compiled = m["compiled"]
    rows = [
        ("artifact", f"{art.path} (format {m['format_version']}, engine {m['engine_version']})"),
        ("build key", m["build_key"]),
        ("model", f"{model['name']} ({model['architecture']}), from {model['source']}"),
        ("shape", f"{config.get('num_hidden_layers')} layers, hidden {config.get('hidden_size')}, "
                  f"heads {config.get('num_attention_heads')}/{config.get('num_key_value_heads')} (q/kv), "
                  f"vocab {config.get('vocab_size')}"),
        ("target", f"{target['arch']}; torch {target['torch']}, triton {target['triton']}, cuda {target['cuda']}, "
                   f"hip {target['hip']}, cpu isa {target['cpu_isa']}"),
        ("layout", f"tp {build['tensor_parallel_size']}, ep {build['enable_expert_parallel']}"),
        ("numerics", f"dtype {build['dtype']}, quant {build['quant']}, kv cache {build['kv_cache_dtype']}"),
        ("limits", f"max model len {build['max_model_len']}, block size {build['block_size']}"),
        ("compiled", "AOTInductor packages " + ", ".join(f"{k}: {v}" for k, v in compiled["packages"].items())
                     if compiled["kind"] == "aotinductor"
                     else "none: the runtime runs the model module eagerly (built with --compile none)"),
        ("cuda graphs", ", ".join(map(str, graphs["capture_sizes"])) or graphs.get("note", "none")),
        ("built", f"{m['built_at']} on {m['build_host']} in "
                  + ", ".join(f"{k} {v:.1f}s" for k, v in m["build_seconds"].items())),
    ]
    lines = [f"{k:<12} {v}" for k, v in rows]
    lines.append("kernels" + (" (measured at build)" if tuning.get("measured") else ""))
    for op, choice in tuning.get("kernels", {}).items():
        lines.append(f"  {op:<22} {choice}")
    for phase, row in tuning.get("phases", {}).items():
        lines.append(f"  {phase + ' phase':<22} {row}")
    lines.append("members")
    for name, info in sorted(m["members"].items()):
        stored = f", stored zstd {info['stored_size'] / 2**20:.2f} MiB" if info["stored"] == "zstd" else ""
        lines.append(f"  {name:<40} {info['size'] / 2**20:9.2f} MiB{stored}  sha256 {info['sha256'][:16]}")
    return "\n".join(lines)
