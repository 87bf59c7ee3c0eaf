"""A scenario as a list of steps (model folder, artifact, one measuring process per engine), printed by
--dry-run or run in order; each engine's figures come back as JSON and go into one result file."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from atom_aot.bench.gpu.scenarios import WEIGHTS, Scenario, engine_kwargs_vllm

REPO = Path(__file__).resolve().parents[3]
REPO_CONFIGS = REPO / "scripts" / "gpu" / "configs"
VLLM_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


class SetupError(RuntimeError):
    """A run that cannot start: a missing config, tokenizer or vLLM; said in words, no traceback."""


@dataclass(frozen=True)
class Step:
    label: str
    argv: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    action: Callable[[], None] | None = field(default=None, compare=False)
    skip_if: Path | None = None          # already there: reused

    def shell(self) -> str:
        import shlex
        if self.action is not None:
            return f"# {self.label} (in the runner)"
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env)
        return (env + " " if env else "") + shlex.join(self.argv)


@dataclass(frozen=True)
class Paths:
    assets: Path            # configs/NAME.json and tokenizers/NAME/
    work: Path              # model folders, artifacts, each engine's JSON and log
    vllm_path: Path | None  # a folder holding vLLM (PYTHONPATH), e.g. the staged bundle's /tmp/vsite

    def config(self, name: str) -> Path:
        for folder in (self.assets / "configs", REPO_CONFIGS):
            if (folder / f"{name}.json").is_file():
                return folder / f"{name}.json"
        raise SetupError(f"no config {name}.json in {self.assets / 'configs'} or {REPO_CONFIGS} "
                         "(--assets names the folder holding configs/ and tokenizers/)")

    def tokenizer(self, name: str) -> Path:
        path = self.assets / "tokenizers" / name
        if not (path / "tokenizer.json").is_file():
            raise SetupError(f"no tokenizer at {path} (--assets names the folder holding configs/ and tokenizers/)")
        return path


SAME_DRAWS = WEIGHTS[3]        # ours draws at load, vLLM loads a checkpoint of the same draws (scenarios.Model)


def model_dir(s: Scenario, paths: Paths) -> Path:
    return paths.work / "models" / f"{s.model.name}-{s.model.weights}"


def checkpoint_dir(s: Scenario, paths: Paths) -> Path:
    """The folder vLLM loads: the scenario's model folder, or for same-draws weights the checkpoint of our draws."""
    folder = model_dir(s, paths)
    return folder.with_name(folder.name + "-checkpoint") if s.model.weights == SAME_DRAWS else folder


def artifact_path(s: Scenario, paths: Paths) -> Path:
    flags = "".join(f.strip("-") for f in s.build_flags)
    return paths.work / "artifacts" / f"{s.model.name}-{s.model.weights}{'-' + flags if flags else ''}.atom"


def run_dir(s: Scenario, paths: Paths) -> Path:
    return paths.work / "runs" / s.name


def config_folder(config: Path, tokenizer: Path, overrides: dict, out: Path) -> None:
    """A config + tokenizer folder: each engine draws the weights (dummy, dummy-at-load)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in tokenizer.iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    (out / "config.json").write_text(json.dumps({**json.loads(config.read_text()), **overrides}, indent=1))


def model_step(s: Scenario, paths: Paths) -> Step:
    config, tokenizer, out = paths.config(s.model.config), paths.tokenizer(s.model.tokenizer), model_dir(s, paths)
    overrides = dict(s.model.overrides)
    if s.model.weights == "random":
        return random_model_step("random-weight model folder", s, paths, out)
    return Step(f"config + tokenizer folder {out}", action=lambda: config_folder(config, tokenizer, overrides, out),
                skip_if=out / "config.json")


def random_model_step(label: str, s: Scenario, paths: Paths, out: Path, *flags: str) -> Step:
    """scripts/make_random_model.py on the GPU: the tensors `atom-build --load-format dummy` draws there."""
    argv = (sys.executable, str(REPO / "scripts" / "make_random_model.py"), "--config", str(paths.config(s.model.config)),
            "--tokenizer", str(paths.tokenizer(s.model.tokenizer)), "--out", str(out), "--device", "cuda",
            "--override", json.dumps(dict(s.model.overrides)), *s.model.checkpoint, *flags)
    return Step(label, argv, (("PYTHONPATH", python_path("ours", paths)),), skip_if=out / "config.json")


def checkpoint_step(s: Scenario, paths: Paths) -> Step:
    """For same-draws weights: the checkpoint vLLM loads, our draws with the experts under the Hub's names."""
    hub = () if "--hub-expert-names" in s.model.checkpoint else ("--hub-expert-names",)
    return random_model_step("checkpoint of our draws for vLLM", s, paths, checkpoint_dir(s, paths), *hub)


def load_format(s: Scenario) -> tuple[str, ...]:
    """Our build's --load-format for the scenario's weights."""
    return {"random": (), SAME_DRAWS: ("--load-format", "dummy-at-load")}.get(s.model.weights,
                                                                              ("--load-format", s.model.weights))


def build_step(s: Scenario, paths: Paths) -> Step:
    load = load_format(s)
    art = artifact_path(s, paths)
    argv = (sys.executable, "-m", "atom_aot.build.cli", "--model", str(model_dir(s, paths)),
            "--max-model-len", str(s.max_model_len), "--out", str(art), *s.build_flags, *load)
    return Step("atom-build", argv, (("PYTHONPATH", python_path("ours", paths)),), skip_if=art)


def python_path(engine: str, paths: Paths) -> str:
    """vLLM's process puts the vLLM folder first; ours keeps its own packages first (the bundle's fastapi,
    pydantic and uvicorn can serve our server where the image lacks them)."""
    ours = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [str(REPO)]
    vllm = [str(paths.vllm_path)] if paths.vllm_path else []
    return os.pathsep.join(vllm + ours if engine == "vllm" else ours + vllm)


def measure_step(engine: str, s: Scenario, paths: Paths) -> Step:
    out = run_dir(s, paths)
    model = checkpoint_dir(s, paths) if engine == "vllm" else model_dir(s, paths)
    argv = [sys.executable, "-m", "atom_aot.bench.gpu.measure", engine, s.name, "--model", str(model),
            "--work", str(out), "--out", str(out / f"{engine}.json")]
    if engine == "ours":
        argv += ["--artifact", str(artifact_path(s, paths))]
    env = {"PYTHONPATH": python_path(engine, paths), "PYTHONUNBUFFERED": "1", **(VLLM_ENV if engine == "vllm" else {})}
    return Step(f"measure {engine}", tuple(argv), tuple(env.items()))


PROFILE_SCRIPTS = {"ours": REPO / "scripts" / "profile_decode.py", "vllm": REPO / "scripts" / "gpu" / "vllm_decode_profile.py"}


def profile_name(engine: str) -> str:
    """The step profile's JSON and log in the run folder: NAME.json, NAME.log."""
    return f"{engine}-step-profile"


def profile_step(engine: str, s: Scenario, paths: Paths) -> Step:
    """The step_profile kind: each engine's decode step at batch num_prompts, kernel by kernel, in a process of its
    own (the engine started once more), by the profiling script of that engine."""
    w, out = s.workload, run_dir(s, paths) / f"{profile_name(engine)}.json"
    argv = [sys.executable, str(PROFILE_SCRIPTS[engine]), "--out", str(out)]
    if engine == "ours":
        argv += ["--artifact", str(artifact_path(s, paths)), "--batch", str(w.num_prompts), "--input-len",
                 str(w.input_len), "--sections", "step,kernels"]
    else:
        kwargs = engine_kwargs_vllm(s)
        argv += ["--model", str(checkpoint_dir(s, paths)), "--load-format", kwargs.pop("load_format", "auto"),
                 "--batch", str(w.num_prompts), "--input-len", str(w.input_len),
                 "--engine-kwargs", json.dumps(kwargs)]
    env = {"PYTHONPATH": python_path(engine, paths), "PYTHONUNBUFFERED": "1", **(VLLM_ENV if engine == "vllm" else {})}
    return Step(f"step profile {engine}", tuple(argv), tuple(env.items()))


def profile_steps(s: Scenario, engines: tuple[str, ...], paths: Paths) -> list[Step]:
    return [profile_step(engine, s, paths) for engine in engines] if "step_profile" in s.workload.kinds else []


def plan(s: Scenario, engines: tuple[str, ...], paths: Paths) -> list[Step]:
    steps = [model_step(s, paths)]
    if "ours" in engines:
        steps.append(build_step(s, paths))
    if "vllm" in engines and s.model.weights == SAME_DRAWS:
        steps.append(checkpoint_step(s, paths))
    return steps + [measure_step(engine, s, paths) for engine in engines]


def execute(step: Step) -> None:
    """Runs a preparation step (its output streams through); a failure stops the run with its label."""
    if step.skip_if is not None and step.skip_if.exists():
        print(f"[bench.gpu] {step.label}: reusing {step.skip_if}", flush=True)
        return
    print(f"[bench.gpu] {step.label}: {step.shell()}", flush=True)
    if step.action is not None:
        step.action()
        return
    rc = subprocess.run(step.argv, env={**os.environ, **dict(step.env)}).returncode
    if rc:
        raise SetupError(f"{step.label} failed (exit code {rc}): {step.shell()}")


def measure(step: Step, name: str, s: Scenario, paths: Paths) -> tuple[dict | None, str | None]:
    """A measuring process (an engine's, or its step profile's: `name`) that writes NAME.json in the run folder;
    its output goes to NAME.log beside it. (figures, error)."""
    out = run_dir(s, paths)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").unlink(missing_ok=True)
    print(f"[bench.gpu] {step.label}: {step.shell()}", flush=True)
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.run(step.argv, env={**os.environ, **dict(step.env)}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True).returncode
    if rc or not (out / f"{name}.json").exists():
        tail = (out / f"{name}.log").read_text()[-4000:]
        return None, f"exit code {rc}; the log ({out / f'{name}.log'}) ends:\n{tail}"
    return json.loads((out / f"{name}.json").read_text()), None
