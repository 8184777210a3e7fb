"""The pipeline the CLI runs: policy -> topology -> profile -> decide -> (explain | launch).

Each stage is its own module with a typed result; this file only wires them, in order, and
is the one place that decides what needs measuring (a dry run only when there is a choice).
"""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping

from smartlaunch.decide.plan import Reason
from smartlaunch.errors import DryRunError
from smartlaunch.profile.session import Session
from smartlaunch.request import Request
from smartlaunch.statusline import StatusLine


def run(request: Request, given: set[str], environ: Mapping[str, str] = os.environ) -> int:
    status = StatusLine()
    try:
        plan, topology, policy = make_plan(request, given, environ, status)
    finally:
        status.clear()           # an error line or the plan starts at column 0
    if request.explain == "json":
        print(plan.to_json())
        return 0
    if request.explain:
        from smartlaunch.decide.explain import render_text
        from smartlaunch.strategies import REGISTRY
        print(render_text(plan, REGISTRY))
        return 0
    from smartlaunch.decide.explain import decision_line
    from smartlaunch.launch import execute
    from smartlaunch.launch.api import context
    from smartlaunch.launch.decision_log import LaunchRecord, exit_code_of
    from smartlaunch.strategies import REGISTRY

    # The decision log's line for this launch (the admins' fleet view): written once, however
    # the launch ends from here on.
    record = LaunchRecord.open(plan, request, policy, REGISTRY, environ)

    def announce(final_plan) -> None:      # once the GPUs are held, just before the job
        record.began(final_plan)
        if not (request.quiet or policy.launch.quiet):
            status.line(decision_line(final_plan, REGISTRY))
        for r in final_plan.reasons:        # an idle Slurm allocation: said even with --quiet
            if r.rule == SLURM_IDLE_RULE:
                status.line(r.text)
    from smartlaunch.scheduler.slurm_fit import release_unused
    released, environ = release_unused(plan, policy, environ)  # slurm.release_unused
    if released:
        status.line(released)
    code = 1
    try:
        ctx = context(request, policy, topology, environ=environ, status=status,
                      announce=announce, log_dir=launch_log_dir(policy, environ, status.line))
        code = execute(plan, ctx, REGISTRY)
        return code
    except BaseException as exc:
        code = exit_code_of(exc)
        raise
    finally:
        status.close()
        record.close(code)


def make_plan(request: Request, given: set[str], environ: Mapping[str, str],
              status: StatusLine | None = None, *, cores: int | None = None):
    """cores: CPUs to count for starting measurements early (profile/early.py; default: this
    process's). Every process the decision starts belongs to one Session, closed here."""
    with Session() as session:
        return _make_plan(request, given, environ, status, cores, session)


def _make_plan(request, given, environ, status, cores, session):
    from smartlaunch.policy.enforce import apply_request
    from smartlaunch.policy.load import load_policy
    from smartlaunch.scheduler import detect
    from smartlaunch.topology import discover

    clock = _Clock()
    status = status if status is not None else StatusLine(tty=False, stream=_Null())
    policy = apply_request(load_policy(request.policy_path, environ=environ), request)
    notes: list[tuple[str, str]] = []   # (reason, rule) added to the plan's reasons
    slurm = detect(environ)
    if slurm is not None and request.torchrun_args is not None:
        notes += [(n, "slurm allocation")
                  for n in slurm.fill_torchrun_args(request.torchrun_args, given)]
        request = dataclasses.replace(
            request, nnodes=str(request.torchrun_args.nnodes),
            nnodes_from="" if "nnodes" in given else "Slurm")

    _check_paths(request, policy, environ)
    clock.lap("policy")
    topology = discover(environ)
    clock.lap("topology")
    if request.multi_node:      # one node decides for all (pipeline_nodes.py)
        from smartlaunch.pipeline_nodes import one_decision
        return one_decision(request, topology, policy, environ, lambda req: _decide_here(
            req, policy, topology, environ, status, cores, session, clock, notes, slurm),
            status)
    return _decide_here(request, policy, topology, environ, status, cores, session, clock,
                        notes, slurm)


def _decide_here(request, policy, topology, environ, status, cores, session, clock, notes,
                 slurm):
    from smartlaunch.decide import decide
    from smartlaunch.decide.probe import probe
    from smartlaunch.decide.prepare import prepare
    from smartlaunch.strategies import REGISTRY
    # Fails an impossible request in milliseconds, before the lease directory is touched or
    # anything is measured; plans for a wait when another launch leases every usable GPU.
    first = probe(request, topology, policy, units=REGISTRY, environ=environ,
                  leased=lambda: frozenset(_leased_elsewhere(topology, policy, status.line)))
    clock.lap("leases")
    early = _start_early(request, policy, topology, environ, first, cores, session)
    if not request.explain:
        session.rules.append(_import_torch_once(session))
    try:
        profile = _profile(request, policy, topology, environ, first.profile_gpu, status,
                           session, early is not None)
    except DryRunError as exc:
        if not (exc.out_of_memory and early is not None and early.drop_trials()):
            raise
        # Its GPU memory was shared with the trial's ranks set up beside it: measure
        # again alone rather than fail a job that fits a GPU on its own.
        status.line("the dry run ran out of GPU memory beside the trial set up with it; "
                    "running it again alone")
        profile = _profile(request, policy, topology, environ, first.profile_gpu, status,
                           session)
    if early is not None and early.dropped:
        notes.append((f"the trial set up beside the dry run was stopped ({early.dropped}); "
                      f"a trial starts the script again", "decision.prestart"))
    clock.lap("profile")
    if profile is not None and not profile.cached and profile.gate_wait_s:
        clock.add({"profile_gate": profile.gate_wait_s})
    trial = _trial_runner(request, policy, environ, topology, profile, status, clock,
                          REGISTRY, session, early) if first.measure else None
    model, model_note = _cost_model(policy, topology, environ, profile)
    notes += model_note
    plan = decide(
        request, topology, policy, profile, units=REGISTRY,
        comm_for=clock.timed("allreduce",
                             _comm_for(topology, policy, environ, profile, status, session,
                                       early, clock)),
        trial=trial,
        unavailable=first.unavailable,
        model=model,
        launched=_launched(request, policy, topology, environ) if profile is not None else None,
        environ=environ, wait_reason=first.wait_reason,
    )
    status.clear()
    clock.lap("decide")
    plan = prepare(plan, topology, policy, environ, units=REGISTRY,
                   torchrun_numa=getattr(request.torchrun_args, "numa_binding", None))
    clock.lap("prepare")
    idle = slurm_idle(slurm, plan)
    if idle:
        notes.append((idle, SLURM_IDLE_RULE))
    if notes:
        plan = dataclasses.replace(
            plan, reasons=plan.reasons + tuple(Reason(text, rule) for text, rule in notes))
    return dataclasses.replace(plan, timings=clock.result()), topology, policy


def _start_early(request, policy, topology, environ, first, cores, session):
    """What a cold decision starts with its dry run (profile/early.py), started; None: none."""
    from smartlaunch.profile import early as early_work
    from smartlaunch.decide.groups import best_group
    from smartlaunch.decide.select import MAX_SCALED_TRIALS
    from smartlaunch.vocab import Strategy
    usable = [g.index for g in topology.gpus if g.index not in first.unavailable
              and not g.busy and topology.healthy(g.index)]
    cap = request.max_gpus
    if request.variants:       # a sweep packs at most len(usable) // variants GPUs a variant
        cap = min(cap or len(usable), len(usable) // len(request.variants))
    size = policy.decision.early_group(len(usable), cap, request.strategy == Strategy.DDP.value)
    due = first.profile_gpu is not None and first.measure and policy.decision.prestart
    if not due or size < 2:
        return None
    # The groups decide weighs for the largest sizes it may try (decide/groups.py): the
    # largest, and the next allowed world size below it (at most MAX_SCALED_TRIALS trials).
    sizes = [size] + sorted((k for k in policy.decision.world_sizes if 2 <= k < size),
                            reverse=True)
    groups = [g for g in (best_group(topology, usable, k, policy.decision.ddp_link_classes)
                          for k in sizes[:MAX_SCALED_TRIALS]) if g is not None]
    if not groups or len(groups[0]) != size:
        return None
    isolated = _isolated(request, policy, environ)
    may_trial = isolated or policy.dryrun.isolation != "require"
    work = early_work.what_to_start(
        dry_run=True, groups=groups,
        cores=len(os.sched_getaffinity(0)) if cores is None else cores,
        sweep_cached=_comm_cached(topology, groups[0], policy, environ),
        trial_wanted=[may_trial and _trial_wanted(request, policy, topology, environ, g)
                      for g in groups])
    if work is None:
        return None
    from smartlaunch.profile.comm import TIME_LIMIT_S, Sweep
    from smartlaunch.profile.trial import Trial
    limit = float(policy.dryrun.time_limit_s)
    sweep = Sweep(session, topology, work.group, policy, environ) if work.sweep else None
    trials = [Trial.start(session, request, policy, environ, isolated, g, gate=True)
              for g in work.trials]
    # The sweep's ranks wait at most about a dry run's time at their gate, then half its limit.
    return early_work.Early(session, trials, sweep,
                            sweep_limit_s=limit + min(TIME_LIMIT_S, limit / 2))


def _import_torch_once(session):
    """A session rule that imports what the launch needs (torch's launcher: ~3 s on a GPU
    node) once, the first time the session serves its processes: after the dry run and what
    starts with it are running, so the import costs the decision nothing."""
    def rule() -> None:
        session.rules.remove(rule)
        import torch.distributed.run  # noqa: F401
    return rule


def _comm_cached(topology, group, policy, environ) -> bool:
    from smartlaunch.profile.cache import cached_comm
    from smartlaunch.profile.comm import backend_for, device_for
    return cached_comm(policy, topology, tuple(group), backend_for(device_for(topology)), environ,
                       need_bytes=0) is not None


def _trial_wanted(request, policy, topology, environ, group) -> bool:
    if not policy.decision.trials or request.no_python or not request.script:
        return False
    from smartlaunch.profile.cache import cached_trial
    from smartlaunch.vocab import Strategy
    return cached_trial(request, policy, topology=topology, environ=environ,
                        strategy=Strategy.DDP, gpus=group) is None


SLURM_IDLE_RULE = "slurm allocation: idle GPUs or nodes"


def slurm_idle(slurm, plan) -> str:
    """One sentence when the plan leaves GPUs or nodes Slurm allocated idle, with the request
    that would fit next time (scheduler/slurm_fit.py); '' otherwise. Admins read wasted
    allocations from job logs, so the launch prints it too (`run`), not only --explain."""
    from smartlaunch.scheduler.slurm_fit import idle_line
    return idle_line(slurm, plan)


def _check_paths(request: Request, policy, environ) -> None:
    """Directories this launch will write, checked before anything is written: the cache for
    a decision that may measure, the log directory every launch writes its run directory in
    (issue 13: a file there gave a traceback after the leases were taken). A cache this user
    cannot write is no error: the decision measures without caching and says so once, where
    it first has something to keep (store.cache_folder, store.keep); a cache path that cannot
    be a directory is one."""
    from smartlaunch.profile.cache import cache_root
    cache = str(cache_root(policy, environ))      # --explain too: a HOME that does not exist
    if request.explain:
        return
    if request.strategy == "auto":
        _check_dir_usable(cache, "paths.cache_dir", policy, write=False)
    launch_log_dir(policy, environ)


def launch_log_dir(policy, environ, say=None) -> str:
    """Where this launch makes its run directory (summary.txt, logs, the ranks' step
    counters): launch.log_dir, checked (_check_dir_usable). Its built-in place, logs/ under
    the cache directory, may be full or read-only like the cache itself, which costs only
    caching: the run directory then goes to a private directory of its own under the system's
    temp directory, said in one line (say None: only checked, nothing made). A launch.log_dir
    someone set must work (exit 3)."""
    from smartlaunch.errors import PolicyError
    from smartlaunch.store import log_root
    root = str(log_root(policy, environ))
    try:
        _check_dir_usable(root, "launch.log_dir", policy)
        return root
    except PolicyError as exc:
        if policy.launch.log_dir:
            raise
        why = str(exc).split(": ", 1)[-1]
    import tempfile
    _check_dir_usable(tempfile.gettempdir(), "launch.log_dir", policy)
    if say is None:
        return tempfile.gettempdir()
    spare = tempfile.mkdtemp(prefix="smartlaunch-logs-")
    say(f"the built-in launch.log_dir {root} cannot take this launch's run files ({why}); "
        f"they go to {spare}")
    return spare


def _check_dir_usable(path: str, key: str, policy, write: bool = True) -> None:
    """A directory the launch will create files under: the path, or its nearest existing
    parent, must be a directory, and the path itself, when it exists, must pass
    store.dir_problem (else exit 3 naming the setting); where `write`, also one this user can
    write, with room on its file system."""
    from smartlaunch.errors import PolicyError
    full = os.path.abspath(os.path.expanduser(path))
    probe = full
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    where = f"{key}={path} ({policy.source_of(key)})"
    from smartlaunch.store import MIN_FREE_BYTES, free_bytes, missing_home
    home = missing_home(full, os.environ)     # expanduser read os.environ's HOME too
    from smartlaunch.policy.load import ENV_VARS
    var = next((v for v, k in ENV_VARS.items() if k == key), key)
    if home:
        raise PolicyError(f"{where}: HOME={home} does not exist and smartlaunch does not create "
                          f"it; set HOME to your home directory, or {var} ({key}) to a directory "
                          f"you can write")
    if not os.path.isdir(probe):
        raise PolicyError(f"{where}: {probe} is not a directory; set {key} to a directory")
    if probe == full:             # made by someone: whose, and who else may write in it
        from smartlaunch.store import dir_problem, unsafe_dir_message
        why = dir_problem(os.lstat(full))
        if why:
            raise PolicyError(unsafe_dir_message(where, full, why, key))
    if write and not os.access(probe, os.W_OK | os.X_OK):
        raise PolicyError(f"{where}: {probe} is not writable by you; set {key} to a directory "
                          f"you can write")
    room = free_bytes(probe) if write else None
    if room is not None and room < MIN_FREE_BYTES:
        raise PolicyError(f"{where}: the file system of {probe} is full ({room >> 10} KiB "
                          f"free; the ranks' step counters there would fail); free space on it, "
                          f"or set {var} ({key}) to a directory on another file system")


class _Clock:
    """Seconds per stage, so --explain can show what the decision cost and where. Calls
    timed through `timed` (all-reduce benchmarks, trials) run inside decide(); their time is
    kept under their own name, not in decide's lap."""

    def __init__(self):
        self.t = self.t0 = time.perf_counter()
        self.laps: dict[str, float] = {}
        self.nested = 0.0                  # timed() seconds since the last lap

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + max(0.0, now - self.t - self.nested)
        self.t, self.nested = now, 0.0

    def timed(self, name: str, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t
                self.laps[name] = self.laps.get(name, 0.0) + spent
                self.nested += spent
        return wrapper

    def add(self, seconds: dict[str, float]) -> None:
        """Parts of a timed stage (a trial's start-up, set-up, steps, exit): shown, not laps."""
        for k, v in seconds.items():
            self.laps[k] = self.laps.get(k, 0.0) + v

    def result(self) -> dict[str, float]:
        out = {k: round(v, 4) for k, v in self.laps.items()}
        out["total"] = round(time.perf_counter() - self.t0, 4)
        import psutil
        try:    # the whole command so far: interpreter start-up and imports included
            out["since_process_start"] = round(time.time() - psutil.Process().create_time(), 3)
        except psutil.Error:
            pass
        return out


def _leased_elsewhere(topology, policy, say) -> set[int]:
    if not topology.gpus:
        return set()
    from smartlaunch.launch.leases import LeaseManager
    with LeaseManager.from_policy(policy, say=say) as leases:
        return leases.taken(topology)


class _Null:
    def write(self, s):
        pass

    def flush(self):
        pass


def _isolated(request, policy, environ) -> bool:
    from smartlaunch.profile.runner import isolation_check
    return isolation_check(request, policy, environ)[0]


def _profile(request, policy, topology, environ, gpu, status, session, gate=False):
    if gpu is None:
        return None
    from smartlaunch.worker_env import narrow_visible
    from smartlaunch.profile.cache import profile_entrypoint
    what = f"profiling {request.script} on GPU{gpu}"

    def announce():
        status.ticking(f"{what} (dry run of at most {policy.dryrun.time_limit_s:.0f} s; "
                       f"cached afterwards)")

    def progress(k: int, n: int) -> None:
        status.progress(f"{what}: dry run step {k} of {max(k, n)}")
    binary = getattr(status.stream, "buffer", None)
    return profile_entrypoint(request, policy, gpu=narrow_visible([gpu], environ, topology),
                              gpu_model=topology.gpu(gpu).name, environ=environ,
                              announce=announce, progress=progress,
                              echo=status.echo(binary) if binary is not None else None,
                              real_gpu=topology.source == "nvml", session=session, gate=gate)


def _comm_for(topology, policy, environ, profile, status, session, early, clock):
    if not topology.gpus:
        return lambda group: None
    from smartlaunch.profile.comm import comm_curve
    max_bytes = None
    if profile is not None and profile.grad_bytes:
        # Only sizes up to the model's gradients matter; it keeps the benchmark short.
        max_bytes = max(1 << 20, 1 << (int(profile.grad_bytes) - 1).bit_length())

    def comm_for(group):
        from smartlaunch.decide.words import gpu_list, mb
        what = f"measuring all-reduce over {gpu_list(group)}"

        def progress(size: int, k: int, n: int) -> None:
            status.progress(f"{what}: all-reduce {mb(size)} ({k} of {n} sizes)")
        sweep = early.sweep if early is not None else None
        if sweep is not None and sweep.gpus == tuple(group):
            # started with the dry run; no benchmark beside it
            status.ticking(f"{what} up to the largest size (started with the dry run; cached "
                           f"afterwards)")
            curve = sweep.curve(progress)
            clock.add({"allreduce_early": sweep.stage_seconds()})
            if curve is not None:
                return curve

        def announce() -> None:        # a cached curve is read without a word
            status.ticking(f"{what} up to {mb(max_bytes) if max_bytes else 'the largest size'} "
                           f"(cached afterwards)")
        return comm_curve(topology, tuple(group), policy, environ, max_bytes=max_bytes,
                          progress=progress, announce=announce, session=session)
    return comm_for


def _cost_model(policy, topology, environ, profile):
    """The cost model with this node's calibrated constants (`smartlaunch-node calibrate`)
    where there are some, and a note for --explain saying which values predict DDP; no note
    where no DDP prediction can be made (fewer than 2 GPUs, no usable profile)."""
    from smartlaunch.decide.cost import CostModel, calibrated
    if len(topology.gpus) < 2 or profile is None or not profile.usable:
        return CostModel(), []
    from smartlaunch.profile.baseline import load_constants
    record = load_constants(policy, topology, environ)
    model, text = calibrated(CostModel(), record)
    rule = "node calibration: smartlaunch-node calibrate" if record else "decide/cost.py"
    return model, [(f"cost model: {text}", rule)]


def _launched(request, policy, topology, environ):
    """Measured rates of earlier launches of this job (profile.feedback)."""
    from smartlaunch.profile.feedback import job_key, load_rates
    return load_rates(policy, job_key(request, policy, topology, environ), environ)


def _trial_runner(request, policy, environ, topology, profile, status, clock, units, session,
                  early):
    if not policy.decision.trials or request.no_python:
        return None
    from smartlaunch.profile.trial import make_trial_runner
    from smartlaunch.profile.cache import cached_trials
    step = profile.step_time_s if profile is not None else None
    setup = profile.startup_s if profile is not None else None
    one_gpu = profile.samples_per_s if profile is not None else None
    runner = make_trial_runner(request, policy, environ, session=session, expected_step_s=step,
                               expected_setup_s=setup,
                               phases=lambda p: clock.add({f"trials_{k}": v for k, v in p.items()}),
                               early=early.take_trials() if early is not None else None)
    trials = _CountedTrials(runner, status, policy.decision.trial_seconds, units)
    trials.run = clock.timed("trials", cached_trials(trials.announced, request, policy,
                                                     topology=topology, environ=environ,
                                                     one_gpu=one_gpu))
    return trials


class _CountedTrials:
    """The trial runner decide() calls, numbering trials for the status line ("trial 2 of
    3: DDP×2 on GPUs 0,1"). decide tells `planned(n)` before a round of n trials, and again
    before a trial its corrections add (the count goes on: "trial 4 of 4"); a trial answered
    from the cache shows nothing, but still counts."""

    def __init__(self, runner, status, seconds: float, units):
        self.runner, self.status, self.seconds, self.units = runner, status, seconds, units
        self.k, self.n = 0, 0
        self.why = getattr(runner, "why", {})     # (strategy, gpus) -> why no measurement

    def planned(self, n: int) -> None:
        self.n = self.k + n

    def __call__(self, strategy, gpus):
        self.k += 1
        return self.run(strategy, gpus)

    def announced(self, strategy, gpus):
        from smartlaunch.decide.api import Role
        from smartlaunch.decide.words import gpu_list
        unit = self.units[strategy]
        what = f"{unit.WORD}×{len(gpus)}" if unit.ROLE == Role.SCALED else unit.WORD
        of = f" of {max(self.n, self.k)}" if self.n else ""
        self.status.ticking(f"trial {self.k}{of}: {what} on {gpu_list(gpus)} (measured steps, "
                            f"at least {self.seconds:g} s)")
        return self.runner(strategy, gpus)
