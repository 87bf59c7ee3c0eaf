"""The `sample` package end to end on one GPU before anything else relies on it: export and AOTInductor-compile it
as atom-build does (build/export_sampler.py), open it as the runtime does (runtime/loading/compiled.py CompiledSampler),
and check its thresholds against the torch reference (a sort) at Qwen3's vocabulary and 1 / 7 / 256 rows.

  PYTHONPATH=. python scripts/gpu/sample_package_check.py --out $OUT/sample-package.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    from atom_aot.build.export import compile_package
    from atom_aot.build.export_sampler import export_sampler
    from atom_aot.ops.sampling import sampling_threshold
    from atom_aot.runtime.loading.compiled import CompiledSampler
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device, vocab = torch.device("cuda"), 151936
    report: dict = {"device": torch.cuda.get_device_name(device)}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        exported = export_sampler(vocab, device)
        report["export_s"] = round(time.perf_counter() - start, 2)
        package = compile_package(exported, Path(tmp) / "sample.pt2")
        report["compile_s"] = round(time.perf_counter() - start - report["export_s"], 2)
        sampler = CompiledSampler(package, device).bind({})
        report["rows"] = []
        g = torch.Generator(device=device).manual_seed(0)
        for n in (1, 7, 256):
            logits = torch.randn(n, vocab, device=device, generator=g) * 3
            params = (torch.randint(0, 60, (n,), device=device, generator=g),
                      torch.rand(n, device=device, generator=g), torch.rand(n, device=device, generator=g) * 0.1)
            got, want = sampler(logits, *params), sampling_threshold(logits, *params)
            report["rows"].append({"rows": n, "equal": bool(torch.equal(got, want))})
    print(json.dumps(report))
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
