"""The start-up check that says when torch's bytecode is not cached (every start recompiles it)."""
import importlib
import logging
import py_compile
import sys

from atom_aot.runtime.loading import bytecode


def _import_fresh(tmp_path, monkeypatch, name: str):
    (tmp_path / f"{name}.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)   # as PYTHONDONTWRITEBYTECODE=1 does
    module = importlib.import_module(name)
    monkeypatch.delitem(sys.modules, name)
    return module


def test_a_module_imported_without_writing_bytecode_is_not_cached(tmp_path, monkeypatch):
    module = _import_fresh(tmp_path, monkeypatch, "atom_bytecode_probe_a")
    assert module.VALUE == 42
    assert not bytecode.bytecode_cached(module)
    py_compile.compile(module.__file__, cfile=importlib.util.cache_from_source(module.__file__))
    assert bytecode.bytecode_cached(module)


def test_builtin_and_extension_modules_count_as_cached():
    assert bytecode.bytecode_cached(sys)


def test_warning_names_the_fix_only_when_torch_is_uncached(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="atom_aot")
    monkeypatch.setattr(bytecode, "torch_bytecode_state",
                        lambda: {"torch_bytecode_cached": False, "dont_write_bytecode": True, "pycache_prefix": None})
    bytecode.warn_if_torch_uncached()
    assert "PYTHONDONTWRITEBYTECODE" in caplog.text and "python -m compileall" in caplog.text
    caplog.clear()
    monkeypatch.setattr(bytecode, "torch_bytecode_state",
                        lambda: {"torch_bytecode_cached": True, "dont_write_bytecode": False, "pycache_prefix": None})
    bytecode.warn_if_torch_uncached()
    assert caplog.text == ""


def test_torch_state_here_reports_all_fields():
    state = bytecode.torch_bytecode_state()
    assert set(state) == {"torch_bytecode_cached", "dont_write_bytecode", "pycache_prefix"}
    assert isinstance(state["torch_bytecode_cached"], bool)
