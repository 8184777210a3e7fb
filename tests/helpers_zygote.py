"""A python that imports torch once and forks one process per command (tests only).

`python -m smartlaunch.cli` spends ~1.3 CPU-s importing torch (torchrun's parser is reused)
before it can say that an argument is wrong; 70 rows of tests/test_cli_bad_input.py made that
70 imports, 165 s of fixture on a loaded 2-core machine. A zygote pays the import once: each
command is then a fork of it that becomes what `python -m MODULE ARGS` would be at its first
line (its own session, cwd, environment, stdin /dev/null, stdout/stderr to files,
sys.path[0] the cwd) and runs the module as __main__. Exit codes are the process's own, as
the zygote reaps it; the command's pid is its session's id, for the test's leftover check.

Run as a script it is the server: `python helpers_zygote.py PRELOAD...`, one JSON request a
line on stdin, two JSON lines back (the pid at the fork, the exit code at the end).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Zygote:
    """One server; run() one command at a time (a pool holds several for concurrency)."""

    def __init__(self, preload: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen([sys.executable, __file__, *preload], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.buf = b""

    def run(self, module: str, args: list[str], cwd: Path, env: dict[str, str], out: Path,
            timeout: float) -> tuple[int, int]:
        """(pid, exit code) of `python -m module args` forked in cwd; killed at the timeout."""
        req = {"module": module, "args": args, "cwd": str(cwd), "env": env,
               "stdout": str(out.with_suffix(".out")), "stderr": str(out.with_suffix(".err"))}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self._line(240.0, "the zygote's import and fork"))["pid"]
        try:
            line = self._line(timeout, f"python -m {module} {args}")
        except TimeoutError:
            os.killpg(pid, signal.SIGKILL)
            self._line(60.0, "the killed command's exit")      # its reply, not the next one's
            raise
        return pid, json.loads(line)["rc"]

    def _line(self, timeout: float, what: str) -> bytes:
        """The next reply line, read unbuffered (a buffered reader could hold both replies
        while select waits on the pipe)."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            if not select.select([fd], [], [], timeout)[0]:
                raise TimeoutError(f"{what} took over {timeout:g} s")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the zygote exited (code {self.proc.wait()}) during {what}")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _child(req: dict) -> None:
    """In the fork: become `python -m module args`, run it, never return."""
    import runpy
    import traceback
    code = 1
    try:
        os.setsid()
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                (1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            f = os.open(path, flags, 0o600)
            os.dup2(f, fd)
            os.close(f)
        sys.path[0] = req["cwd"]                        # as `python -m` sets it
        sys.argv = [req["module"], *req["args"]]        # runpy puts the module's file first
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:                          # as the interpreter reports it
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code & 0xFF)


def serve(preload: list[str]) -> None:
    import importlib
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                # torch's import warnings: ours, not theirs
        for name in preload:
            importlib.import_module(name)
    reply = sys.stdout
    while line := sys.stdin.readline():
        req = json.loads(line)
        # Forked only while single-threaded (nothing preloaded may start a thread).
        assert len(os.listdir("/proc/self/task")) == 1, "the zygote has threads; cannot fork"
        pid = os.fork()
        if pid == 0:
            _child(req)
        reply.write(json.dumps({"pid": pid}) + "\n")
        reply.flush()
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        reply.flush()


if __name__ == "__main__":
    serve(sys.argv[1:])
