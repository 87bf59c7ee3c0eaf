"""torch's CPU threads come from what the process may run on (affinity, cgroup quota) unless the
user chose (num_threads, OMP_NUM_THREADS); the engine process makes idle OpenMP threads sleep."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

from atom_aot.runtime import threads
from atom_aot.runtime.threads import choose_threads, prefer_passive_openmp_wait, set_torch_threads, usable_cpus


@pytest.fixture
def restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_flag_wins_then_omp_num_threads_then_the_usable_cpus():
    assert choose_threads(3, environ={"OMP_NUM_THREADS": "5"}).count == 3
    from_env = choose_threads(None, environ={"OMP_NUM_THREADS": "5"})
    assert from_env.count is None and "OMP_NUM_THREADS=5" in from_env.reason
    assert choose_threads(None, environ={}).count == usable_cpus()


def test_usable_cpus_follow_the_affinity_mask():
    code = ("import os; from atom_aot.runtime.threads import usable_cpus; "
            "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); print(usable_cpus())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "1"


@pytest.mark.parametrize("cpu_max, expected", [("150000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", None)])
def test_a_cgroup_quota_caps_the_cpus(tmp_path, monkeypatch, cpu_max, expected):
    (tmp_path / "cpu.max").write_text(cpu_max)
    monkeypatch.setattr(threads, "CGROUP_CPU_MAX", tmp_path / "cpu.max")
    assert threads._cgroup_quota_cpus() == expected
    assert usable_cpus() == min(len(os.sched_getaffinity(0)), expected or 10 ** 6)


def test_set_torch_threads_sets_and_says_why(caplog, restore_torch_threads):
    with caplog.at_level(logging.INFO, logger="atom_aot"):
        assert set_torch_threads(1) == 1 == torch.get_num_threads()
    assert "torch threads: 1 (num_threads (--num-threads)" in caplog.text


def test_the_engine_process_prefers_passive_waiting_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    prefer_passive_openmp_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    prefer_passive_openmp_wait()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_engine_process_module_leaves_torch_unloaded():
    """Otherwise OpenMP would read its wait policy before the engine process sets it."""
    code = "import sys, atom_aot.runtime.processes.engine_process; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_loading_an_artifact_applies_num_threads(tiny_llama_eager_artifact, restore_torch_threads):
    from atom_aot import LLMEngine
    torch.set_num_threads(2)
    LLMEngine(model=str(tiny_llama_eager_artifact), num_kv_blocks=64, num_threads=1)
    assert torch.get_num_threads() == 1
