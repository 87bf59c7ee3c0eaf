"""Compiled packages are extracted into the process's folder in the atom-aot cache, not the system's temporary
folder: an engine killed mid-run leaves nothing in /tmp, a clean exit removes its folder, and the next start
removes the folders of processes that are gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from atom_aot.runtime.loading import extraction

LOAD_AND_WAIT = """
import sys, time
from atom_aot.runtime.loading.loader import load_artifact
loaded = load_artifact(sys.argv[1])
print(loaded.execution, flush=True)
time.sleep(120)
"""

FOLDER_AND_EXIT = """
from atom_aot.runtime.loading.extraction import process_folder
print(process_folder(), flush=True)
"""

# a forked tensor-parallel rank leaves with os._exit, which runs no exit handlers
FOLDER_AND_HARD_EXIT = """
import os
from atom_aot.runtime.loading.extraction import process_folder, remove_process_folder
print(process_folder(), flush=True)
remove_process_folder()
os._exit(0)
"""


def child_env(system_tmp: Path) -> dict[str, str]:
    """The test's cache (conftest's ATOM_AOT_CACHE), and a temporary folder of its own standing in for /tmp."""
    system_tmp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(system_tmp)}


def mapped_packages(pid: int) -> set[str]:
    """The compiled packages' files a process has mapped (its wrapper .so)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return {line.split(maxsplit=5)[5] for line in maps if "aotinductor_" in line and len(line.split()) == 6}


def test_a_killed_engine_leaves_nothing_in_tmp_and_the_next_start_removes_its_folder(tiny_llama_artifact, tmp_path):
    system_tmp = tmp_path / "system-tmp"
    child = subprocess.Popen([sys.executable, "-c", LOAD_AND_WAIT, str(tiny_llama_artifact)],
                             env=child_env(system_tmp), stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "aotinductor"
        folder = extraction.extraction_root() / extraction.folder_name(child.pid)
        mapped = mapped_packages(child.pid)
        assert mapped and all(Path(p).is_relative_to(folder) for p in mapped), mapped
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert not list(system_tmp.glob("aotinductor_*"))
    assert list(folder.glob("aotinductor_*"))                 # killed: nothing ran to remove it
    assert extraction.remove_stale() == [folder] or not folder.exists()
    assert not folder.exists()


@pytest.mark.parametrize("code", [FOLDER_AND_EXIT, FOLDER_AND_HARD_EXIT], ids=["exit", "os._exit"])
def test_a_clean_exit_removes_the_folder(tmp_path, code):
    out = subprocess.run([sys.executable, "-c", code], env=child_env(tmp_path / "system-tmp"),
                         capture_output=True, text=True, check=True).stdout
    folder = Path(out.strip())
    assert folder.parent == extraction.extraction_root() and not folder.exists()


def test_only_folders_of_processes_that_are_gone_are_removed(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    me, started = os.getpid(), extraction.start_time(os.getpid())
    names = {"gone": f"{gone.stdout.strip()}-1", "alive": f"{me}-{started}",
             "pid reused": f"{me}-{started + 1}", "not ours": "notes"}
    for name in names.values():
        (tmp_path / name).mkdir()
    removed = extraction.remove_stale(tmp_path)
    assert {p.name for p in removed} == {names["gone"], names["pid reused"]}
    assert {p.name for p in tmp_path.iterdir()} == {names["alive"], names["not ours"]}
