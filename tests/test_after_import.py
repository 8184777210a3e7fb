"""entry.after_import: the worker hook and the dry run wait for the script's own import of
torch (they never import it first)."""
from __future__ import annotations

import importlib
import importlib.util
import sys

from smartlaunch import entry


def test_actions_run_once_right_after_the_scripts_import(tmp_path, monkeypatch, capsys):
    (tmp_path / "sl_probe_mod.py").write_text("X = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "sl_probe_mod", raising=False)
    seen = []
    entry.after_import("sl_probe_mod", lambda m: seen.append(m.X + 1), "probe not run")
    entry.after_import("sl_probe_mod", lambda m: 1 / 0, "probe not run")   # said, import goes on
    assert seen == [] and "sl_probe_mod" not in sys.modules
    mod = importlib.import_module("sl_probe_mod")
    assert seen == [42] and mod.X == 41
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "probe not run (ZeroDivisionError" in err[0]
    assert not any(isinstance(f, entry._AfterImport) for f in sys.meta_path)
    assert "exec_module" not in vars(mod.__spec__.loader)     # the loader is its own again
    entry.after_import("sl_probe_mod", lambda m: seen.append(m.X), "probe")   # imported: at once
    assert seen == [42, 41]
    sys.modules.pop("sl_probe_mod")


def test_a_lookup_before_the_import_runs_nothing_and_loses_nothing(tmp_path, monkeypatch):
    """transformers asks importlib.util.find_spec("torch") before it imports torch: the
    actions wait for the import that executes the module."""
    (tmp_path / "sl_probe_mod2.py").write_text("X = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "sl_probe_mod2", raising=False)
    seen = []
    entry.after_import("sl_probe_mod2", lambda m: seen.append(m.X), "probe not run")
    assert importlib.util.find_spec("sl_probe_mod2") is not None
    assert importlib.util.find_spec("sl_probe_mod2") is not None
    assert seen == [] and "sl_probe_mod2" not in sys.modules
    importlib.import_module("sl_probe_mod2")
    assert seen == [7]
    assert not any(isinstance(f, entry._AfterImport) for f in sys.meta_path)
    sys.modules.pop("sl_probe_mod2")
