"""The offline engine's log lines reach a program that did not configure logging, at ATOM_LOGGING_LEVEL."""
import logging
import re
import subprocess
import sys

import pytest

from atom_aot.logging_setup import show_engine_logs

PROGRAM = """
import logging, sys
from atom_aot.logging_setup import show_engine_logs
if sys.argv[1] == "configured":
    logging.basicConfig(level=logging.ERROR)
show_engine_logs()
log = logging.getLogger("atom_aot")
log.info("an info line")
log.warning("a warning line")
"""


STAMP = re.compile(r"^(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d\.\d\d\d atom_aot: ")


def unstamped(lines: list[str]) -> list[str]:
    """The lines without their clock, checked to carry one (month-day, time to the millisecond, as vLLM's)."""
    assert all(STAMP.match(line) for line in lines), lines
    return [STAMP.sub(lambda m: f"{m.group(1)} atom_aot: ", line) for line in lines]


def run(mode: str, **env) -> str:
    import os
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_a_program_without_logging_sees_info_lines_once():
    assert unstamped(run("plain").splitlines()) == ["INFO atom_aot: an info line", "WARNING atom_aot: a warning line"]


def test_the_level_comes_from_the_environment_and_the_programs_own_configuration_wins():
    assert unstamped(run("plain", ATOM_LOGGING_LEVEL="warning").splitlines()) == ["WARNING atom_aot: a warning line"]
    assert "info line" not in run("configured") and "warning line" not in run("configured")


def test_a_bad_level_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logging.getLogger("atom_aot"), "handlers", [])
    with pytest.raises(ValueError, match="ATOM_LOGGING_LEVEL='loud'"):
        show_engine_logs({"ATOM_LOGGING_LEVEL": "loud"})
