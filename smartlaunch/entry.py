"""Run the user's entrypoint in this process exactly as `python [-m] TARGET ARGS` would:
`__file__`, `sys.argv[0]` and `sys.path[0]` as under torchrun (so a plain file is compiled
and executed here, not by runpy.run_path, which would change `sys.argv[0]`)."""
from __future__ import annotations

import builtins
import importlib.abc
import os
import runpy
import sys
import types
from collections.abc import Callable
from importlib.machinery import SourceFileLoader
from types import ModuleType


def run_entrypoint(target: str, args: list[str], *, module: bool) -> None:
    sys.argv = [target, *args]
    if module:
        _set_path0(os.getcwd())
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    path = os.path.abspath(target)
    _set_path0(os.path.dirname(os.path.realpath(target)))
    if not os.path.isfile(path):       # a directory or zip with __main__.py
        runpy.run_path(target, run_name="__main__")
        return
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __spec__=None, __cached__=None,
                         __loader__=SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, main.__dict__)


def _set_path0(path: str) -> None:
    """sys.path[0] as python gives the script (its folder; the current one for a module):
    put in front under -P (proc.python_m), where sys.path has no such entry, else replaced."""
    if getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, path)
    else:
        sys.path[0] = path


def after_import(name: str, action: Callable[[ModuleType], None], failed: str) -> None:
    """action(module) once the script has imported module `name` (at once if it is imported),
    never importing it here: torch imported before the script runs reads its environment
    (OMP_NUM_THREADS, ...) before the script's own first lines set it, as python and torchrun
    never do, and costs a script that never imports torch its import. An action that raises is
    said in one line, `smartlaunch: <failed> (<error>); the job goes on`; the import is not."""
    if name in sys.modules:
        _run_action(action, sys.modules[name], failed)
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _AfterImport)), None)
    if finder is None:
        finder = _AfterImport()
        sys.meta_path.insert(0, finder)
    finder.actions.setdefault(name, []).append((action, failed))


def _run_action(action: Callable[[ModuleType], None], module: ModuleType, failed: str) -> None:
    try:
        action(module)
    except Exception as exc:
        print(f"smartlaunch: {failed} ({exc!r}); the job goes on", file=sys.stderr, flush=True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module it waits on, it takes the spec the other finders
    give and has that spec's loader run the actions right after it executes the module. A spec
    only looked up (importlib.util.find_spec("torch"), as transformers does before importing
    it) runs nothing: the actions wait for the import that executes the module. Gone from
    sys.meta_path once nothing is awaited."""

    def __init__(self) -> None:
        self.actions: dict[str, list[tuple[Callable[[ModuleType], None], str]]] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.actions:
            return None
        spec = None
        for finder in [f for f in sys.meta_path if f is not self]:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec                   # not a module we can follow: the actions never run
        run = loader.exec_module

        def exec_module(module) -> None:
            try:
                run(module)
            finally:
                del loader.exec_module    # the loader's own method again
            actions = self.actions.pop(name, [])
            if not self.actions and self in sys.meta_path:
                sys.meta_path.remove(self)
            for action, failed in actions:
                _run_action(action, module, failed)

        loader.exec_module = exec_module
        return spec


_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep
_RUNPY = {os.path.abspath(runpy.__file__), "<frozen runpy>"}


def script_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback without smartlaunch's frames: from the script's first frame on (None when
    every frame is ours), less ours in between (after_import's, when the script's import of
    torch fails)."""
    def ours(t: types.TracebackType) -> bool:
        name = t.tb_frame.f_code.co_filename
        full = os.path.abspath(name)
        return full.startswith(_OURS) or name in _RUNPY or full in _RUNPY

    while tb is not None and ours(tb):
        tb = tb.tb_next
    at = tb
    while at is not None:
        while at.tb_next is not None and at.tb_next.tb_frame.f_code.co_filename.startswith(_OURS):
            at.tb_next = at.tb_next.tb_next
        at = at.tb_next
    return tb


def report_uncaught(exc: BaseException) -> int:
    """What python does with an uncaught exception, with only the script's frames; returns
    the exit status python would give (1, or 130 for KeyboardInterrupt)."""
    tb = script_frames(exc.__traceback__)
    exc = exc.with_traceback(tb)
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException:       # a broken hook: the exception is still printed
        sys.__excepthook__(type(exc), exc, tb)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def exit_now(code: object = 0) -> None:
    """End the process at once, skipping the script's teardown; code: as `sys.exit(code)`."""
    if code is not None and not isinstance(code, int):
        try:
            print(code, file=sys.stderr)
        except (OSError, ValueError):
            pass
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code or 0)
