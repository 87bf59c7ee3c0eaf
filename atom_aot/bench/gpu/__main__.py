"""GPU benchmark of a named scenario, atom-aot against vLLM, measured by the same code in a process per engine.

  python -m atom_aot.bench.gpu SCENARIO [--engines ours,vllm] [--out FILE.json | FOLDER] [--dry-run | --prepare-only]
  python -m atom_aot.bench.gpu --list
Makes the scenario's random-weight model folder and artifact (reused when already in --work), runs each
engine's measuring process, and writes one JSON (default folder docs/benchmarks, named
DEVICE-SCENARIO-DATE.json) with the device, commit, versions, the command and every figure.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import sys
from pathlib import Path

from atom_aot.bench.gpu import result as results
from atom_aot.bench.gpu.measure import ENGINES
from atom_aot.bench.gpu.runner import REPO, Paths, SetupError, execute, measure, plan, profile_name, profile_steps
from atom_aot.bench.gpu.scenarios import UnknownScenario, scenario, table

DEFAULT_VLLM_PATH = Path("/tmp/vsite")     # where scripts/gpu/stage.sh installs the vLLM bundle


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atom_aot.bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("scenario", nargs="?", help="a scenario name (--list shows them)")
    p.add_argument("--list", action="store_true", help="print the scenarios as a Markdown table")
    p.add_argument("--engines", default="ours,vllm", help="comma list of: ours, vllm")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks",
                   help="the result file, or a folder for DEVICE-SCENARIO-DATE.json")
    p.add_argument("--assets", type=Path, default=Path(".gpu"),
                   help="folder with configs/NAME.json and tokenizers/NAME/ (scripts/gpu/stage.sh fills .gpu)")
    p.add_argument("--work", type=Path, default=Path("/tmp/atom-bench"), help="model folders, artifacts, logs")
    p.add_argument("--vllm-path", type=Path, default=None,
                   help=f"a folder holding vLLM, put on vLLM's PYTHONPATH (default {DEFAULT_VLLM_PATH} if it exists)")
    p.add_argument("--commit", help="the commit to record (default: git rev-parse HEAD of this checkout)")
    p.add_argument("--dry-run", action="store_true", help="print the commands it would run, run nothing")
    p.add_argument("--prepare-only", action="store_true",
                   help="make the model folders, checkpoint and artifact the engines need, measure nothing (a GPU "
                        "command of its own, before the one that measures: both must fit the command's time limit)")
    return p.parse_args(argv)


def engines_of(text: str) -> tuple[str, ...]:
    engines = tuple(e.strip() for e in text.split(",") if e.strip())
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise SetupError(f"--engines takes a comma list of {', '.join(ENGINES)}; got {text!r}")
    return engines


def vllm_path(args, engines: tuple[str, ...]) -> Path | None:
    """The vLLM folder, or None where vLLM is importable here already; a vLLM run without vLLM is refused."""
    if args.vllm_path is not None:
        if not (args.vllm_path / "vllm").is_dir():
            raise SetupError(f"--vllm-path {args.vllm_path} holds no vllm package")
        return args.vllm_path
    if (DEFAULT_VLLM_PATH / "vllm").is_dir():
        return DEFAULT_VLLM_PATH
    if "vllm" in engines and not (args.dry_run or args.prepare_only) and importlib.util.find_spec("vllm") is None:
        raise SetupError(f"vLLM is not importable and {DEFAULT_VLLM_PATH} holds none: stage the bundle "
                         "(scripts/gpu/stage.sh) or pass --vllm-path, or run --engines ours")
    return None


def run(args, argv: list[str]) -> int:
    s = scenario(args.scenario)
    engines = engines_of(args.engines)
    paths = Paths(args.assets.resolve(), args.work.resolve(), vllm_path(args, engines))
    steps, profiles = plan(s, engines, paths), profile_steps(s, engines, paths)
    today = datetime.date.today()
    if args.dry_run:
        for step in steps + profiles:
            print(step.shell())
        out = args.out / f"DEVICE-{s.name}-{today.isoformat()}.json" if args.out.is_dir() else args.out
        print(f"# result: {out}")
        return 0
    prepare, measuring = steps[:-len(engines)], steps[-len(engines):]
    for step in prepare:
        execute(step)
    if args.prepare_only:
        print(f"[bench.gpu] prepared {s.name} for {', '.join(engines)}; nothing measured (--prepare-only)", flush=True)
        return 0
    engines_out, errors = {}, {}
    for engine, step in zip(engines, measuring):
        figures, error = measure(step, engine, s, paths)
        if figures is not None:
            engines_out[engine] = figures
        else:
            errors[engine] = error
            print(f"[bench.gpu] {engine} failed: {error}", file=sys.stderr, flush=True)
    for engine, step in zip(engines, profiles):
        figures, error = measure(step, profile_name(engine), s, paths)
        if figures is not None:
            engines_out.setdefault(engine, {})["step_profile"] = figures
        else:
            errors[profile_name(engine)] = error
            print(f"[bench.gpu] {profile_name(engine)} failed: {error}", file=sys.stderr, flush=True)
    commit = args.commit or results.commit_of(REPO)
    data = results.assemble(s, engines_out, errors, ["python", "-m", "atom_aot.bench.gpu", *argv], commit, today)
    path = results.write(data, args.out, s, today)
    print(f"[bench.gpu] wrote {path}; ratios (> 1 favours ours): {data['ratios']}", flush=True)
    return 1 if errors else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.list:
        print(table())
        return 0
    if not args.scenario:
        print("name a scenario (python -m atom_aot.bench.gpu --list shows them)", file=sys.stderr)
        return 2
    try:
        return run(args, argv)
    except (SetupError, UnknownScenario) as e:
        print(f"bench.gpu: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
