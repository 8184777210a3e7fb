"""Run the user's entrypoint in this process exactly as `python [-m] TARGET ARGS` would, which
is what torchrun's workers do: `__file__`, `sys.argv[0]` and `sys.path[0]` equal torchrun's,
so tracebacks, warnings and paths built from `__file__` do too.

`python script.py` (3.9+): `__file__` is the absolute path (symlinks kept), `sys.argv[0]` the
path as typed, `sys.path[0]` the directory of the resolved script. runpy.run_path would set
`sys.argv[0]` to its argument, so a plain file is compiled and executed here instead.
`python -m mod`: runpy.run_module with alter_sys, `sys.path[0]` the working directory.
"""
from __future__ import annotations

import builtins
import os
import runpy
import sys
import types
from importlib.machinery import SourceFileLoader


def run_entrypoint(target: str, args: list[str], *, module: bool) -> None:
    if module:
        sys.argv = [target, *args]
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    path = os.path.abspath(target)
    sys.argv = [target, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(target))
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


_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep
_RUNPY = {os.path.abspath(runpy.__file__), "<frozen runpy>"}


def script_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback from the script's first frame on: smartlaunch's and runpy's leading
    frames dropped (None when every frame is ours, e.g. a SyntaxError in the script, which
    python then prints without a "Traceback" header, as it does itself)."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (os.path.abspath(name).startswith(_OURS) or name in _RUNPY
                or os.path.abspath(name) in _RUNPY):
            return tb
        tb = tb.tb_next
    return None


def report_uncaught(exc: BaseException) -> int:
    """What python does with an exception the script did not catch, with only the script's
    frames: sys.excepthook (the script's own, if it set one) on the trimmed traceback, the
    streams flushed. Returns the exit status python would give: 1, or 130 for
    KeyboardInterrupt (python kills itself with SIGINT there; a status says the same)."""
    # Set on the exception too: python's own hook prints the exception's __traceback__.
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
    """End the process at once (the dry run's, once its result is written): the script's
    teardown is only what the user would wait for, and can be long (a DataLoader with
    persistent workers joins each for up to 5 s at interpreter exit). The parent ends the
    session's other processes (DataLoader workers).
    code: as `sys.exit(code)` would end (None 0, an int itself, anything else printed, 1)."""
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
