"""The one driver of a decision: `Driver(...).plan(request) -> Plan` answers each Need the
pure decide step returns (`fulfil`), and owns everything that touches the world on the way:
leases, caches, the dry run and what starts early beside it, sweeps, trials, the status line
and the clock."""
from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping

from smartlaunch.allocation import JobAllocation
from smartlaunch.decide.api import (Inputs, Measured, Need, NeedCurve, NeedLeases, NeedNodes,
                                    NeedProfile, NeedTrial, Role, TrialResult, Units)
from smartlaunch.decide.decide import decide, resolve
from smartlaunch.decide.plan import Plan, Reason
from smartlaunch.decide.words import gpu_list, mb
from smartlaunch.errors import DryRunError
from smartlaunch.policy.api import Policy
from smartlaunch.profile.cache import (cached_comm, cached_trial, cached_trials,
                                       profile_entrypoint)
from smartlaunch.profile.comm import TIME_LIMIT_S, Sweep, backend_for, comm_curve, device_for
from smartlaunch.profile.session import Session
from smartlaunch.profile.trial import Trial, make_trial_runner
from smartlaunch.request import Request
from smartlaunch.statusline import StatusLine
from smartlaunch.topology.api import Topology
from smartlaunch.vocab import Strategy

log = logging.getLogger(__name__)

HELD_TRIALS = 3       # trials kept alive to measure again: the baseline's and two candidates'
HELD_MEMORY = 0.8     # of the least free GPU memory, for the held trials and a running one


class Clock:
    """Seconds per stage of the decision: each lap is the time since the last one; `add`
    keeps parts of a stage beside the laps."""

    def __init__(self):
        self.t = self.t0 = time.perf_counter()
        self.laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.add({name: max(0.0, now - self.t)})
        self.t = now

    def add(self, seconds: Mapping[str, float]) -> None:
        for k, v in seconds.items():
            self.laps[k] = self.laps.get(k, 0.0) + v

    def result(self) -> dict[str, float]:
        out = {k: round(v, 4) for k, v in self.laps.items()}
        out["total"] = round(time.perf_counter() - self.t0, 4)
        import psutil
        try:
            out["since_process_start"] = round(time.time() - psutil.Process().create_time(), 3)
        except psutil.Error:
            pass
        return out


@dataclasses.dataclass
class Driver:
    """Measurements for one command line's decision. cores: CPUs to count for starting
    measurements early (None: this process's)."""
    policy: Policy
    topology: Topology
    environ: Mapping[str, str]
    session: Session
    status: StatusLine
    units: Units
    clock: Clock = dataclasses.field(default_factory=Clock)
    cores: int | None = None
    early: object = None            # profile.early.Early, once started
    _runner: object = None          # the trial runner, made at the first trial
    _torch_rule: bool = False       # _import_torch_once is (or was) a session rule
    _between: Callable | None = None  # fulfils NeedNodes (plan's `between`)

    def plan(self, request: Request, notes: tuple[Reason, ...] = (),
             allocation: JobAllocation | None = None, nodes: int = 0,
             between: Callable[[NeedNodes], object] | None = None) -> Plan:
        """The Plan decide makes for `request` with every Need fulfilled here (notes,
        allocation, nodes: see Inputs; between: fulfils NeedNodes)."""
        self.request, self.early, self._runner = request, None, None
        self._between = between
        inputs = Inputs(request, self.topology, self.policy, self.units, self.environ,
                        notes=notes, numactl=shutil.which("numactl") or "",
                        allocation=allocation, nodes=nodes,
                        torchrun_numa=getattr(request.torchrun_args, "numa_binding", None))
        decide(inputs)      # an impossible request fails here, before the caches are read
        model, model_note = self._cost_model()
        launched = {}
        if request.strategy == "auto" and self.topology.gpus:   # only auto weighs them
            from smartlaunch.profile.feedback import job_key, load_rates
            launched = load_rates(self.policy, job_key(request, self.policy, self.topology,
                                                       self.environ), self.environ)
        inputs = dataclasses.replace(inputs, model=model, model_note=model_note,
                                     launched=launched)
        if not request.explain and not self._torch_rule:
            self._torch_rule = True
            self.session.rules.append(self._import_torch_once)
        try:
            return resolve(inputs, self.fulfil, timings=self._timings)
        finally:
            self.status.clear()

    def _timings(self) -> dict[str, float]:
        self.clock.lap("decide")
        return self.clock.result()

    def fulfil(self, need: Need, measured: Measured) -> Measured:
        """`measured` with the answer to `need` (and any reason it adds) in it."""
        self.clock.lap("decide")
        log.debug("decide needs %s", need)
        t0 = time.perf_counter()
        if isinstance(need, NeedLeases):
            got = measured.add(need, self._leased())
            self.clock.lap("leases")
            return got
        if isinstance(need, NeedProfile):
            got = self._profile(need, measured)
            self.clock.lap("profile")
            gpus = {need.gpu} | self._early_gpus()
        elif isinstance(need, NeedCurve):
            got = measured.add(need, self._curve(need))
            self.clock.lap("allreduce")
            gpus = set(need.gpus)
        elif isinstance(need, NeedNodes):
            got = measured.add(need, self._between(need) if self._between is not None
                               else "no rendezvous store to measure it over")
            self.clock.lap("nodes")
            gpus = set(need.gpus[:1])         # one leader rank on this node
        else:
            got = measured.add(need, self._trial(need, measured))
            self.clock.lap("trials")
            gpus = set(need.gpus)
        # GPU-seconds the measurement occupied (the fleet report's measure_gpu_s).
        self.clock.add({"measure_gpu_s": (time.perf_counter() - t0) * len(gpus)})
        log.debug("answered: %s", ", ".join(f"{k} {v:.3f} s" for k, v in self.clock.laps.items()))
        return got

    def _leased(self) -> frozenset[int]:
        from smartlaunch.launch.leases import LeaseManager
        with LeaseManager.from_policy(self.policy, say=self.status.line) as leases:
            return frozenset(leases.taken(self.topology))

    def _profile(self, need: NeedProfile, measured: Measured) -> Measured:
        self.early = self._start_early(need)
        try:
            profile = self._dry_run(need.gpu, gate=self.early is not None)
        except DryRunError as exc:
            if not (exc.out_of_memory and self.early is not None and self.early.drop_trials()):
                raise
            # out of memory beside the early trial: measure again alone
            self.status.line("the dry run ran out of GPU memory beside the trial set up with "
                             "it; running it again alone")
            profile = self._dry_run(need.gpu)
        got = measured.add(need, profile)
        if self.early is not None and self.early.dropped:
            got = dataclasses.replace(got, notes=got.notes + (Reason(
                f"the trial set up beside the dry run was stopped ({self.early.dropped}); a "
                f"trial starts the script again", "decision.prestart"),))
        if profile is not None and not profile.cached and profile.gate_wait_s:
            self.clock.add({"profile_gate": profile.gate_wait_s})
        return got

    def _dry_run(self, gpu: int, gate: bool = False):
        from smartlaunch.topology import sharing
        from smartlaunch.worker_env import narrow_visible
        request, policy, status = self.request, self.policy, self.status
        what = f"profiling {request.script} on GPU{gpu}"

        def announce():
            status.ticking(f"{what} (dry run of at most {policy.dryrun.time_limit_s:.0f} s"
                           f"{_cached_afterwards('; ')})")

        def progress(k: int, n: int) -> None:
            status.progress(f"{what}: dry run step {k} of {max(k, n)}")
        binary = getattr(status.stream, "buffer", None)
        return profile_entrypoint(
            request, policy, gpu=narrow_visible([gpu], self.environ, self.topology),
            gpu_model=self.topology.gpu(gpu).name, environ=self.environ, announce=announce,
            progress=progress, echo=status.echo(binary) if binary is not None else None,
            real_gpu=self.topology.source == "nvml", session=self.session, gate=gate,
            shared=lambda: sharing(self.topology, (gpu,), self.environ))

    def _start_early(self, need: NeedProfile):
        """What a cold decision starts beside its dry run (profile/early.py), or None."""
        from smartlaunch.decide.groups import best_group
        from smartlaunch.decide.select import MAX_SCALED_TRIALS
        from smartlaunch.profile import early as early_work
        request, policy, topology = self.request, self.policy, self.topology
        usable = list(need.usable)
        cap = request.max_gpus
        if request.variants:       # a sweep packs at most len(usable) // variants GPUs a variant
            cap = min(cap or len(usable), len(usable) // len(request.variants))
        size = policy.decision.early_group(len(usable), cap, request.strategy == Strategy.DDP.value)
        if not policy.decision.prestart or size < 2:
            return None
        # The groups decide weighs for the largest sizes it may try.
        sizes = [size] + sorted((k for k in policy.decision.world_sizes if 2 <= k < size),
                                reverse=True)
        groups = [g for g in (best_group(topology, usable, k, policy.decision.ddp_link_classes)
                              for k in sizes[:MAX_SCALED_TRIALS]) if g is not None]
        if not groups or len(groups[0]) != size:
            return None
        from smartlaunch.profile.runner import isolation_check
        isolated = isolation_check(request, policy, self.environ)[0]
        may_trial = isolated or policy.dryrun.isolation != "require"
        work = early_work.what_to_start(
            dry_run=True, groups=groups,
            cores=len(os.sched_getaffinity(0)) if self.cores is None else self.cores,
            sweep_cached=self._curve_cached(groups[0]),
            trial_wanted=[may_trial and self._trial_wanted(g) for g in groups])
        if work is None:
            return None
        limit = float(policy.dryrun.time_limit_s)
        sweep = Sweep(self.session, topology, work.group, policy, self.environ) \
            if work.sweep else None
        trials = [Trial.start(self.session, request, policy, self.environ, isolated, g,
                              topology=topology, gate=True, hold=True)
                  for g in work.trials]
        return early_work.Early(self.session, trials, sweep,
                                sweep_limit_s=limit + min(TIME_LIMIT_S, limit / 2))

    def _early_gpus(self) -> set[int]:
        """The GPUs of what started beside the dry run."""
        if self.early is None:
            return set()
        out = set(self.early.sweep.gpus) if self.early.sweep is not None else set()
        for t in self.early.trials:
            out |= set(t.gpus)
        return out

    def _curve_cached(self, group) -> bool:
        return cached_comm(self.policy, self.topology, tuple(group),
                           backend_for(device_for(self.topology)), self.environ,
                           need_bytes=0) is not None

    def _trial_wanted(self, group) -> bool:
        request = self.request
        if not self.policy.decision.trials or request.no_python or not request.script:
            return False
        return cached_trial(request, self.policy, topology=self.topology, environ=self.environ,
                            strategy=Strategy.DDP, gpus=group) is None

    def _curve(self, need: NeedCurve):
        status, group = self.status, need.gpus
        what = f"measuring all-reduce over {gpu_list(group)}"

        def progress(size: int, k: int, n: int) -> None:
            status.progress(f"{what}: all-reduce {mb(size)} ({k} of {n} sizes)")
        sweep = self.early.sweep if self.early is not None else None
        if sweep is not None and sweep.gpus == group:
            status.ticking(f"{what} up to the largest size (started with the dry run"
                           f"{_cached_afterwards('; ')})")
            curve = sweep.curve(progress)
            self.clock.add({"allreduce_early": sweep.stage_seconds()})
            if curve is not None:
                return curve

        def announce() -> None:        # a cached curve is read without a word
            top = mb(need.max_bytes) if need.max_bytes else "the largest size"
            status.ticking(f"{what} up to {top}{_cached_afterwards(' (', ')')}")
        return comm_curve(self.topology, group, self.policy, self.environ,
                          max_bytes=need.max_bytes, progress=progress, announce=announce,
                          session=self.session)

    def _trial(self, need: NeedTrial, measured: Measured) -> TrialResult:
        """The kept rate of this trial, else a trial run now and kept."""
        profile = measured.profile
        one_gpu = profile.samples_per_s if profile is not None else None
        runner = self._trial_runner(profile)

        def announced(strategy, gpus):
            unit = self.units[strategy]
            what = f"{unit.WORD}×{len(gpus)}" if unit.ROLE == Role.SCALED else unit.WORD
            again = " again, near the policy's floor" if need.attempt > 1 else ""
            self.status.ticking(f"trial {need.number} of {need.of}: {what} on {gpu_list(gpus)}"
                                f"{again} (measured steps, at least "
                                f"{self.policy.decision.trial_seconds:g} s)")
            return runner(strategy, gpus)
        run = cached_trials(announced, self.request, self.policy, topology=self.topology,
                            environ=self.environ, one_gpu=one_gpu)
        rate = run(need.strategy, need.gpus, need.attempt)
        why = runner.why.get((need.strategy, need.gpus), "") if rate is None else ""
        return TrialResult(rate, why)

    def _trial_runner(self, profile):
        if self._runner is None:
            self._runner = make_trial_runner(
                self.request, self.policy, self.environ, topology=self.topology,
                session=self.session,
                expected_step_s=profile.step_time_s if profile is not None else None,
                expected_setup_s=profile.startup_s if profile is not None else None,
                phases=lambda p: self.clock.add({f"trials_{k}": v for k, v in p.items()}),
                early=self.early.take_trials() if self.early is not None else None,
                hold=held_trials(profile.peak_gpu_mem_bytes if profile is not None else None,
                                 [g.memory_free_mib for g in self.topology.gpus]))
        return self._runner

    def _import_torch_once(self) -> None:
        """A session rule, run once: import torch's launcher while the session's processes
        run, so the import costs the decision nothing."""
        self.session.rules.remove(self._import_torch_once)
        importlib.import_module("torch.distributed.run")

    def _cost_model(self):
        """(the cost model with this node's calibrated constants if any, its reason)."""
        from smartlaunch.decide.cost import CostModel, calibrated
        if len(self.topology.gpus) < 2:
            return CostModel(), None
        from smartlaunch.profile.baseline import load_constants
        record = load_constants(self.policy, self.topology, self.environ)
        model, text = calibrated(CostModel(), record)
        rule = "node calibration: smartlaunch-node calibrate" if record else \
            "shipped cost model: docs/decision.md"
        return model, Reason(f"cost model: {text}", rule)


def held_trials(peak_bytes: int | None, free_mib: list[int]) -> int:
    """How many measured trials stay alive to measure again (near the policy's floor):
    HELD_TRIALS, fewer where that many copies of the dry run's peak GPU memory (`peak_bytes`) and
    a running trial's would not fit in HELD_MEMORY of the least free GPU memory (`free_mib`, per
    GPU; zero: unknown). Without either figure (a CPU run), HELD_TRIALS."""
    free = [f for f in free_mib if f]
    if not peak_bytes or not free:
        return HELD_TRIALS
    fit = int(HELD_MEMORY * min(free) * 2**20 // peak_bytes) - 1
    return max(0, min(HELD_TRIALS, fit))


class NullStream:
    """A status line's stream that shows nothing (make_plan without a terminal)."""

    def write(self, s):
        pass

    def flush(self):
        pass


def _cached_afterwards(before: str, after: str = "") -> str:
    """'cached afterwards' between before and after, or nothing where the cache is off."""
    from smartlaunch.store import uncached
    return "" if uncached() else f"{before}cached afterwards{after}"
