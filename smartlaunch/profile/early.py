"""The dry run's process, started before smartlaunch has parsed its own command line.

smartlaunch parses its options with torchrun's parser, so its own start is an `import torch`
(4.2-6.5 s of a cold decision on 2x H200, 2026-11-23), after which the dry run's process paid
the same import again before the script's first line. Here the dry run's python starts first:
a warm process (warm.py) inside the dry run's sandbox imports torch while smartlaunch imports
its own; once the request, policy and topology are known, runner.run_dry_run gives it the dry
run as its go instead of starting a cold one.

It is started on a guess made before the command line is parsed, so it is checked before it is
used: the dry run must be due, the policy must allow warm processes (`decision.prestart`) and
isolate the dry run as this process was isolated. Otherwise it is killed unused, having imported
torch and touched no GPU and no file of the user's (it runs nothing of theirs before its go).
Started only when that guess says a dry run may be due (not when this command line, from this
directory, already has a stored profile: cache.seen_marker) and a core is spare beside
smartlaunch's own import (not on CI's 2 cores); `prestart: false` in the policy read then
starts none. With it, when trials are on and cores are spare for them, the DDP trial's warm
ranks on the GPUs counted without NVML (`start_trial`; pipeline_pools adopts or kills them).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

from smartlaunch import proc, sandbox

SPARE_CORES = 2          # smartlaunch's own import and one more, left to everything else
# Options after which no dry run runs (the guess only: the parsed request decides).
NO_DRY_RUN = ("-h", "--help", "--help-torchrun", "--no-python", "--no_python", "--version")


class EarlyDryRun:
    """A warm python in the dry run's sandbox (or none, isolated=False), waiting for its go.

    Its temp dir holds what run_dry_run's own would: result/ (kept out of the sandbox: the
    profile, the step ticks, the isolation status) and the sandbox's scratch; its stdout goes
    to a file there until run_dry_run copies it into the dry run's log."""

    def __init__(self, environ, *, isolated: bool, python: str = sys.executable):
        from smartlaunch.profile.runner import dryrun_env, isolation_status
        from smartlaunch import warm
        self.isolated = isolated
        self.tmp = tempfile.mkdtemp(prefix="smartlaunch-dryrun-")
        proc.remove_on_exit(self.tmp)
        self.child: proc.Child | None = None
        self.trial = None        # profile.trial.TrialSetup: warm ranks for the DDP trial
        try:
            os.mkdir(self.result_dir)
            self.stdout_path = os.path.join(self.tmp, "early-stdout.log")
            cmd = [python, "-u", "-m", "smartlaunch.warm"]
            if isolated:
                cmd = sandbox.wrap(cmd, os.path.join(self.tmp, "early-scratch"),
                                   [self.result_dir], isolation_status(self.tmp), python=python)
            with open(self.stdout_path, "wb") as out:
                self.child = warm.spawn(cmd, dryrun_env(environ, None), stdout=out,
                                        stderr=subprocess.PIPE, stage="the dry run")
        except BaseException:
            self.close()
            raise

    @property
    def result_dir(self) -> str:
        from smartlaunch.profile.runner import result_dir
        return result_dir(self.tmp)

    def take(self, argv: list[str], env: dict[str, str]) -> proc.Child | None:
        """The process running the dry run (`python -m <the dry run> argv`, exactly env), or None
        when it died before its go (isolation refused, import failed): start one cold."""
        from smartlaunch.profile.runner import DRYRUN_MODULE
        from smartlaunch.warm import send_go
        child, self.child = self.child, None
        if child is None or not send_go(child, DRYRUN_MODULE, argv, env):
            if child is not None:
                child.stop(signal.SIGKILL, 0)
            return None
        return child

    def copy_stdout(self, log) -> None:
        """What the dry run printed, into its log (a binary file open for writing)."""
        try:
            with open(self.stdout_path, "rb") as f:
                shutil.copyfileobj(f, log)
        except OSError:
            pass

    def start_trial(self, environ, size: int, python: str = sys.executable) -> None:
        """The DDP trial's warm ranks on the first `size` GPUs, spawned now (a guess, like
        this process): pipeline_pools.start adopts them when the decision's own guess is the
        same trial, else they are killed unused. On 2x H200 they otherwise started 4 s later,
        after smartlaunch's own import, and the dry run waited that long at its gate."""
        from smartlaunch.profile.trial import TrialSetup
        try:
            self.trial = TrialSetup(None, None, environ, self.isolated, python=python,
                                    warm=size, gpus=tuple(range(size)))
        except OSError:
            self.trial = None

    def take_trial(self):
        trial, self.trial = self.trial, None
        return trial

    def close(self) -> None:
        """Unused: killed (it holds nothing worth a grace). Its temp dir goes either way."""
        if self.trial is not None:
            self.take_trial().close()
        if self.child is not None:
            self.child.stop(signal.SIGKILL, 0)
            self.child = None
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            proc.remove_on_exit(self.tmp, done=True)
            self.tmp = ""


def start(argv: list[str], environ, *, cores: int | None = None) -> EarlyDryRun | None:
    """The early dry-run process, when the unparsed command line suggests a dry run may come;
    None otherwise, or when anything about the guess fails (the parsed request then reports
    real errors as usual)."""
    if environ.get("SMARTLAUNCH_DRYRUN") or any(a in NO_DRY_RUN for a in argv):
        return None
    if _option(argv, "--strategy") not in (None, "auto"):
        return None
    if _option(argv, "--nnodes") not in (None, "1", "1:1"):
        return None                      # a multi-node job is launched as torchrun would: no dry run
    budget = len(os.sched_getaffinity(0)) if cores is None else cores
    if budget - SPARE_CORES < 1:
        return None
    try:
        from smartlaunch.policy.load import load_policy
        from smartlaunch.profile.cache import seen_marker
        from smartlaunch.store import cache_root
        policy = load_policy(_option(argv, "--policy"), environ=environ)
        root, cwd = cache_root(policy, environ), os.getcwd()
        # The script is one of argv's words; the one whose command line has a stored profile
        # makes a cache hit likely (--reprofile measures again whatever is stored).
        seen = "--reprofile" not in argv and any(
            seen_marker(root, cwd, word, argv[i + 1:]).exists() for i, word in enumerate(argv))
    except Exception:                    # the parse will name what is wrong with it
        return None
    if not policy.decision.prestart or seen:
        return None
    try:
        early = EarlyDryRun(environ, isolated=policy.dryrun.isolation != "off")
    except OSError:                      # no temp dir, no fork: the dry run starts cold
        return None
    # The trial's ranks: trials on, and cores for them beside the dry run's and our import;
    # as many as pipeline_pools will want (DecisionPolicy.early_group), or it kills them.
    nproc = _int(_option(argv, "--nproc-per-node") or _option(argv, "--nproc_per_node"))
    size = policy.decision.early_group(_gpu_guess(environ), nproc)
    if policy.decision.trials and size >= 2 and budget - SPARE_CORES - 1 >= size:
        early.start_trial(environ, size)
    return early


def _gpu_guess(environ) -> int:
    """GPUs this job may see, without NVML or torch: the fake topology's (tests), else the
    driver's entries in /proc, at most as many as CUDA_VISIBLE_DEVICES names."""
    fake = environ.get("SMARTLAUNCH_FAKE_TOPOLOGY")
    try:
        if fake:
            import json
            from smartlaunch.topology.fake import fixture_file
            n = len(json.loads(fixture_file(fake).read_text()).get("gpus", []))
        else:
            n = len(os.listdir("/proc/driver/nvidia/gpus"))
    except (OSError, ValueError, AttributeError):
        return 0
    seen = environ.get("CUDA_VISIBLE_DEVICES")
    return n if seen is None else min(n, len([s for s in seen.split(",") if s.strip()]))


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _option(argv: list[str], name: str) -> str | None:
    """The value of the first `name V` or `name=V` (a guess: it may be the script's own)."""
    for i, tok in enumerate(argv):
        if tok == name and i + 1 < len(argv):
            return argv[i + 1]
        if tok.startswith(name + "="):
            return tok.split("=", 1)[1]
    return None
