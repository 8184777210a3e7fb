"""DDP through torch's own elastic agent (`config_from_args` on torchrun's parsed namespace, so
every torchrun option behaves as in torchrun), with the worker hook as entrypoint, the group
narrowed to plan.gpus, plan.env added, a watchdog thread and the guard's tag on every rank.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from smartlaunch.decide.plan import Plan
from smartlaunch.errors import ExitCode, UsageError
from smartlaunch import proc as procs
from smartlaunch.launch import flightrec
from smartlaunch.launch.api import LaunchContext, LaunchResult, RankFailure, RunState
from smartlaunch.launch.signals import (CRASHES, TERMINATING as _TERMINATING, crash_stacks,
                                       handling, stuck_main_escape)
from smartlaunch.launch.straggler import summary_text
from smartlaunch.launch.summary import SUMMARY_FILE, write_summary
from smartlaunch.launch.watchdog import Watchdog
from smartlaunch.launch.worker import STATUS_LINE_VAR, TEE_DIR_VAR, stack_path, worker_env
from smartlaunch.topology.api import Topology, shared_text

log = logging.getLogger(__name__)

WORKER_MODULE = "smartlaunch.launch.worker"
LOG_TAIL_LINES = 15
OUTPUT_DRAIN_S = 5.0        # the most a finished run waits for its ranks' last output lines
# What gloo and NCCL say in a rank whose peer went away: the cause may be on another node.
PEER_LOST = re.compile(r"Connection (closed|reset) by peer|remote worker|remote process exited|"
                       r"ncclRemoteError")


class DDPLauncher:
    """The Launcher (launch/api.py) around torch's elastic agent. poll() runs the agent on the
    main thread: a terminating signal's handler raises torch's SignalException inside it."""

    def __init__(self, plan: Plan, ctx: LaunchContext):
        self.plan, self.ctx = plan, ctx
        self.got: list[int] = []            # every forwarded signal, warnings included
        self.watchdog: Watchdog | None = None
        self._ended = False                 # every process of the run is gone
        self._in_agent = False
        self._result: LaunchResult | None = None
        self._rendezvous: Exception | None = None   # torch's RendezvousError, if one ended the run
        self._readings = None               # topology.live_readings of the run's GPUs

    def start(self) -> None:
        plan, ctx = self.plan, self.ctx
        if ctx.torchrun_args is None:
            raise UsageError("DDP launch needs torchrun's parsed arguments (LaunchContext.torchrun_args): "
                             "build the launch through smartlaunch's command line")
        if plan.device == "cuda" and plan.gpus:   # exactly its group: chosen for its links
            ctx.hold(plan, len(plan.gpus))
        ctx.begin(plan)
        from torch.distributed.run import config_from_args

        environ = dict(ctx.environ)
        args = argparse.Namespace(**vars(ctx.torchrun_args))
        _torchrun_preprocess(args)
        args.nproc_per_node = str(plan.nproc_per_node)
        args.nnodes = plan.nnodes       # a multi-node plan may use fewer nodes (decide/nodes.py)
        self.run_dir = run_dir = ctx.new_run_dir()
        self.run_id = run_id = os.path.basename(run_dir)
        user_logs = bool(args.log_dir) or args.redirects != "0" or args.tee != "0"
        if not args.log_dir:        # else torch leaves $TMPDIR/torchelastic_* behind
            args.log_dir = os.path.join(run_dir, "torchelastic")
        overrides = _worker_overrides(plan, ctx.topology, environ, run_dir, run_id,
                                      numa=args.numa_binding is None)
        if not user_logs:   # the hook copies each rank's output; the terminal sees it unchanged
            overrides[TEE_DIR_VAR] = self.log_root = os.path.join(run_dir, "logs")
            if sys.stderr.isatty():
                overrides[STATUS_LINE_VAR] = "1"
        else:
            self.log_root = args.log_dir
        recorder = None     # on when asked, or when the job's environment has it on anyway
        if ctx.policy.launch.flight_recorder or flightrec.enabled_by(environ):
            fr_env, recorder = flightrec.recorder_env({**environ, **overrides}, run_dir)
            overrides.update(fr_env)
        self.host = socket.gethostname()
        # the guard SIGKILLs every process with this tag when smartlaunch dies
        overrides[procs.GUARD_VAR] = procs.guard_tag(f"ddp-{run_id}")
        self.watchdog = Watchdog(
            run_dir, plan.nproc_per_node, ctx.policy.launch, self.host,
            act_on_death=args.max_restarts == 0,
            gpu_of=lambda lr: plan.gpus[lr] if plan.device == "cuda" and lr < len(plan.gpus) else None,
            read_topology=self._live_gpus(plan, ctx.topology, environ),
            flight_recorder=recorder if plan.device == "cuda" else None,
            display=sys.stderr.isatty(), planned=ctx.topology)
        with _patched_environ(overrides):
            self.config, cmd, cmd_args = config_from_args(args)
            self.entry = _wrap_entrypoint(cmd, cmd_args, args)
            # what config_from_args set in os.environ (OMP_NUM_THREADS), for the agent in poll()
            self.overrides = {k: v for k, v in os.environ.items() if environ.get(k) != v}
        fields = {f.name for f in dataclasses.fields(self.config)}
        if "shutdown_timeout" in fields:    # the policy's, which holds --shutdown-timeout
            self.config.shutdown_timeout = max(1, math.ceil(ctx.signal_grace_s))
        if "signals_to_handle" in fields:
            self.config.signals_to_handle = "SIGQUIT"  # ours: TERM/INT/HUP/USR1/USR2 (run_loop)

    def forward(self, signum: int) -> None:
        self.got.append(signum)
        if self.watchdog is None:
            return
        if signum not in _TERMINATING:
            self.watchdog.forward(signum, group=False)  # a warning for the rank, not its DataLoader workers
            return
        self.watchdog.stop(None, self.ctx.signal_grace_s)   # SIGKILL backstop; the agent forwards signum
        if self._in_agent:
            from torch.distributed.elastic.multiprocessing.api import SignalException
            raise SignalException(f"smartlaunch got {signal.Signals(signum).name}",
                                  sigval=signal.Signals(signum))

    def poll(self) -> LaunchResult | None:
        if self._result is None and self.watchdog is not None:
            failures: dict = {}
            try:
                if not any(s in _TERMINATING for s in self.got):
                    with _patched_environ(self.overrides):
                        failures = self._run_agent()
            finally:
                self._end_processes()
            self._result = self._finish(failures)
        return self._result

    def close(self, sig: int = signal.SIGTERM) -> None:
        if self._result is None and self.watchdog is not None:
            self.watchdog.stop(sig, self.ctx.signal_grace_s)
            self._end_processes()

    def _run_agent(self) -> dict:
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed import DistNetworkError
        from torch.distributed.elastic.rendezvous.api import RendezvousError
        from torch.distributed.launcher.api import launch_agent

        with handling((signal.SIGCHLD,), lambda _s, _f: self.watchdog.note_children()), \
                stuck_main_escape(self._stuck):
            self.watchdog.start()
            try:
                self._in_agent = True
                log.debug("torch's agent starts %s rank(s) of %s", self.config.nproc_per_node,
                          " ".join(map(str, self.entry[1])))
                launch_agent(self.config, self.entry[0], list(self.entry[1]))
            except ChildFailedError as exc:
                return dict(exc.failures)
            except SignalException:
                pass
            except (RendezvousError, DistNetworkError) as exc:  # a traceback in torchrun
                self._rendezvous = exc      # the agent stopped its ranks, if it had any
            finally:
                self._in_agent = False
        return {}

    def _stuck(self) -> str | None:
        """What the agent waits for when no rank has started (stuck_main_escape), else None."""
        if not self._in_agent or self.watchdog.records():
            return None
        return "while torch's agent waited for the rendezvous (its store never answered)"

    def _live_gpus(self, plan: Plan, topology: Topology, environ):
        """The watchdog's NVML readings of the plan's GPUs only; None without GPUs."""
        if plan.device != "cuda" or not plan.gpus:
            return None
        from smartlaunch.topology import live_readings
        self._readings = reader = live_readings(environ)
        gpus = tuple(plan.gpus)
        return lambda: reader.read(topology, gpus)

    def _end_processes(self) -> None:
        """Idempotent: the watchdog, every process of the run."""
        if self._ended:
            return
        self._ended = True
        self.watchdog.close()
        self.watchdog.monitor.last_look(time.monotonic())
        if self._readings is not None:
            self._readings.close()
        procs.kill_run(self.run_id, self.watchdog.live_pids().values(), drain_s=OUTPUT_DRAIN_S)

    def _finish(self, failures: dict) -> LaunchResult:
        watchdog, run_dir, plan = self.watchdog, self.run_dir, self.plan
        result = _result(watchdog, failures, self.got, self.host, self.log_root, run_dir,
                         multi_node=plan.multi_node)
        if self._rendezvous is not None and result.state == RunState.SUCCEEDED:
            result = _rendezvous_result(self._rendezvous, self.ctx.torchrun_args,
                                       started=bool(watchdog.records()), details=result.details)
        summary = _summary(watchdog, plan, result, self.log_root or run_dir, run_dir)
        path = write_summary(run_dir, summary) or f"{SUMMARY_FILE} could not be written in {run_dir}"
        # A failure, a hang or a warning brings the whole summary to stderr; a clean run its
        # first line and where the rest is (unless quiet).
        if self._rendezvous is not None and not watchdog.records():
            msg = result.message        # no rank ran: the one line says it all
        elif result.state != RunState.SUCCEEDED or watchdog.monitor.warnings or watchdog.straggler:
            msg = f"{result.message}\n{summary}" if result.message else summary
        elif self.ctx.quiet:
            msg = result.message
        else:
            head = f"{summary.splitlines()[0]} (all of it: {path})"
            msg = f"{result.message}\n{head}" if result.message else head
        if result.state != RunState.HUNG:      # a hang's rate says nothing about the job's
            self.ctx.record(plan, run_dir, shared_text(watchdog.monitor.shared))
        return dataclasses.replace(result, message=msg, details={**result.details, "summary": summary})


def _summary(watchdog: Watchdog, plan: Plan, result: LaunchResult, log_root: str, run_dir: str) -> str:
    figures = watchdog.monitor.figures(watchdog.records())
    profile = plan.profile
    figures.batch = profile.batch_size if profile is not None else None
    if plan.device == "cuda" and profile is not None and profile.step_time_s \
            and plan.nproc_per_node > 1:
        figures.single_step_s = profile.step_time_s
    figures.log_dir = log_root
    figures.run_dir = run_dir
    if result.details.get("hang") is not None:
        figures.dumps = [*result.details["hang"].stack_files, *result.details["hang"].dump_files]
    return summary_text(figures, result.state.value)


def _result(watchdog: Watchdog, failures: dict, got: list[int], host: str, log_root: str,
            run_dir: str, multi_node: bool = False) -> LaunchResult:
    details = {"run_dir": run_dir, "log_dir": log_root, "straggler": watchdog.straggler}
    if watchdog.hang is not None:
        h = watchdog.hang
        msg = (f"smartlaunch: hang: {h.describe(host)}. Stacks of all ranks: "
               f"{', '.join(h.stack_files)}. Job ended (exit {int(ExitCode.HANG)}).")
        msg += "".join(f"\n  collectives: {line}" for line in h.collectives)
        if h.dump_files:
            msg += f"\n  Flight Recorder dumps: {', '.join(h.dump_files)}"
        return LaunchResult(RunState.HUNG, int(ExitCode.HANG), msg, (), {**details, "hang": h})
    terminating = [s for s in got if s in _TERMINATING]
    if terminating or (got and failures):
        sig = (terminating or got)[0]
        name = signal.Signals(sig).name
        msg = f"smartlaunch: got {name}: forwarded to all ranks, stopped them (exit {128 + sig})"
        return LaunchResult(RunState.INTERRUPTED, 128 + sig, msg, (), details)
    root = _root_failure(watchdog.failure, failures, host, log_root)
    if root is None:
        return LaunchResult(RunState.SUCCEEDED, 0, "", (), details)
    msg = f"smartlaunch: {root.describe()}; the other ranks were stopped."
    if multi_node and PEER_LOST.search(root.log_tail):
        msg += (" Its error says a peer went away: the job may have ended on another node "
                "first (that node's smartlaunch output says why).")
    if root.log_tail:
        tail = "\n".join(f"    | {line}" for line in root.log_tail.splitlines())
        msg += f"\n  last lines of {root.log_path}:\n{tail}"
    if root.signal in CRASHES and (stacks := crash_stacks(stack_path(run_dir, root.local_rank))):
        msg += f"\n  its Python stacks at the crash: {stacks}"
    return LaunchResult(RunState.FAILED, int(ExitCode.WORKER_FAILED), msg, (root,), details)


def _rendezvous_result(exc: Exception, args, started: bool, details: dict) -> LaunchResult:
    """One line for a rendezvous error of torch's agent (exit RENDEZVOUS). started: this
    node's ranks had started (a store lost mid-run is another node's end)."""
    from torch.distributed import DistNetworkError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError, RendezvousConnectionError, RendezvousTimeoutError)
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config
    from torch.distributed.run import parse_min_max_nnodes
    code = int(ExitCode.RENDEZVOUS)
    where = f"{args.rdzv_endpoint or 'the default endpoint'} (rdzv id {args.rdzv_id})"
    if isinstance(exc, RendezvousTimeoutError):
        try:
            conf = _parse_rendezvous_config(args.rdzv_conf or "")
        except ValueError:
            conf = {}
        limit = conf.get("join_timeout", f"{RendezvousTimeout().join.total_seconds():g}")
        least = parse_min_max_nnodes(str(args.nnodes))[0]
        text = (f"rendezvous timed out: fewer than {least} nodes (nnodes {args.nnodes}) joined "
                f"{where} within join_timeout={limit} s; start smartlaunch on every node with "
                f"the same rendezvous endpoint and id, or raise --rdzv-conf join_timeout")
    elif isinstance(exc, RendezvousClosedError):
        text = (f"rendezvous {where} is closed: another node ended the job (its own output "
                f"says why: a node whose hardware differs from the plan's exits 12 and closes "
                f"it); give a new --rdzv-id to start another")
    elif isinstance(exc, RendezvousConnectionError) and started:
        text = (f"lost the rendezvous store at {where} while the job ran: the node that hosts "
                f"it ended (its own output names why); this node's ranks were stopped")
    elif isinstance(exc, RendezvousConnectionError):
        text = (f"cannot reach the rendezvous store at {where}; check that the endpoint names "
                f"the first node, that smartlaunch runs there, and that its port is reachable "
                f"from this node")
    elif isinstance(exc, DistNetworkError) and "EADDRINUSE" in str(exc) and not started:
        port = args.master_port if args.rdzv_backend == "static" \
            else str(args.rdzv_endpoint).rsplit(":", 1)[-1]
        text = (f"cannot host the rendezvous store: port {port} on this node is in use "
                f"(another job's, often one started without --standalone); add --standalone "
                f"(one node: a free port is picked), or give a free --master-port")
    elif isinstance(exc, DistNetworkError):
        text = (f"the rendezvous store at {where} failed "
                f"{'while the job ran' if started else 'before any rank started'}: {exc}")
    else:
        text = f"rendezvous {where} failed: {type(exc).__name__}: {exc}"
    return LaunchResult(RunState.FAILED, code, f"smartlaunch: {text} (exit {code})", (), details)


def _root_failure(seen: RankFailure | None, failures: dict, host: str, log_root: str) -> RankFailure | None:
    """The watchdog saw the first death; torch's agent reaped it and knows its exit status."""
    by_local = {pf.local_rank: pf for pf in failures.values()}
    if seen is None:
        if not failures:
            return None
        first = min(failures, key=lambda r: (failures[r].exitcode == -signal.SIGTERM, failures[r].timestamp, r))
        pf = failures[first]
        seen = RankFailure(pf.local_rank, first, host, pf.pid, None, None)
    if seen.local_rank in by_local and seen.exit_code is None and seen.signal is None:
        pf = by_local[seen.local_rank]
        code, sig = (None, pf.signal_name()) if pf.exitcode < 0 else (pf.exitcode, None)
        seen = RankFailure(seen.local_rank, seen.rank, host, seen.pid or pf.pid, code, sig)
    path, tail = log_tail(log_root, seen.local_rank)
    return RankFailure(seen.local_rank, seen.rank, seen.host, seen.pid, seen.exit_code,
                       seen.signal, tail, path)


def log_tail(log_root: str | None, local_rank: int) -> tuple[str | None, str]:
    """Last lines of a rank's log: the hook's <root>/<local_rank>/, or torch's layout
    <root>/<id>/attempt_<n>/<local_rank>/ when the user gave --log-dir/--tee/--redirects."""
    if not log_root:
        return None, ""
    root = Path(log_root)
    found = [*root.glob(f"*/attempt_*/{local_rank}/std*.log"), *root.glob(f"{local_rank}/std*.log")]
    # the newest attempt's directory, its stderr first (the error is there)
    found.sort(key=lambda p: (p.parent.stat().st_mtime, p.parent, p.name == "stderr.log"))
    for path in reversed(found):
        text = path.read_text(errors="replace").rstrip()
        if text:
            return str(path), "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
    return (str(found[-1]) if found else None), ""


def _torchrun_preprocess(args: argparse.Namespace) -> None:
    """torch.distributed.run.run()'s rewriting of the namespace, before config_from_args."""
    import uuid
    from torch.distributed.run import parse_min_max_nnodes
    no_port = getattr(args, "master_port", None) is None
    if args.standalone or (args.rdzv_backend == "static" and not args.rdzv_endpoint and no_port
                           and parse_min_max_nnodes(args.nnodes)[1] == 1):
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if no_port:
        args.master_port = 29500


def _wrap_entrypoint(cmd, cmd_args: list[str], args) -> tuple[str, list[str]]:
    """torchrun's (cmd, args) with the worker hook in front of the script."""
    python = cmd if isinstance(cmd, str) and not args.no_python else os.getenv("PYTHON_EXEC", sys.executable)
    hook = procs.python_m(WORKER_MODULE, python, flags=("-u",))[1:]
    if callable(cmd) or args.run_path:
        return python, [*hook, *cmd_args]
    if args.no_python:
        return python, [*hook, "--no-python", cmd, *cmd_args]
    rest = list(cmd_args)
    while rest and rest[0] in ("-u", "-m"):
        rest.pop(0)
    flags = ["--module"] if args.module else []
    return python, [*hook, *flags, *rest]


def _worker_overrides(plan: Plan, topology: Topology, environ: Mapping[str, str], run_dir: str,
                      run_id: str, numa: bool) -> dict[str, str]:
    from smartlaunch.worker_env import narrow_visible
    env: dict[str, str] = {}
    if plan.device == "cuda" and plan.gpus and tuple(plan.gpus) != tuple(g.index for g in topology.gpus):
        env["CUDA_VISIBLE_DEVICES"] = narrow_visible(plan.gpus, environ, topology)
    env.update(plan.env_dict())
    env.update(worker_env(run_dir, run_id, plan.numa if numa else ()))
    return env


@contextlib.contextmanager
def _patched_environ(changes: Mapping[str, str]) -> Iterator[None]:
    """os.environ with `changes` (torch's agent builds worker environments from it) inside."""
    saved = dict(os.environ)
    os.environ.update(changes)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)

