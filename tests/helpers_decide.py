"""Fake machines, profiles and all-reduce curves for the decision tests.

Topologies are built from smartlaunch.topology.api types (the shapes of the topology layer's
JSON fixtures); `fixture()` loads one of those fixtures when it exists.
"""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

from smartlaunch.decide.plan import Candidate, strategy_name
from smartlaunch.policy.api import DecisionPolicy, Policy
from smartlaunch.profile.api import CommCurve, ModelProfile, ProfileStatus
from smartlaunch.request import Request
from smartlaunch.topology.api import (
    GPU, Finding, GPUProcess, Link, Severity, Topology, link_family,
)

GiB = 1024 ** 3
MiB = 1024 ** 2
FIXTURES = Path(__file__).resolve().parent.parent / "smartlaunch" / "topology" / "fixtures"

# Busbw by link family, roughly what the reference machines measured (GB/s).
BUSBW = {"NV": 296e9, "PIX": 24e9, "PXB": 22e9, "PHB": 12e9, "NODE": 10e9, "SYS": 3.1e9}


def gpu(i: int, *, numa: int = 0, total_gib: int = 80, free_gib: float | None = None,
        foreign: bool = False, lost: bool = False, name: str = "NVIDIA H200") -> GPU:
    free = int((total_gib - 1 if free_gib is None else free_gib) * 1024)
    procs = (GPUProcess(pid=4242, user="someone", used_mib=9000, ours=False),) if foreign else ()
    return GPU(index=i, nvml_index=i, uuid=f"GPU-{i:04d}", name=name,
               pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", memory_total_mib=total_gib * 1024,
               memory_free_mib=free, memory_used_mib=total_gib * 1024 - free, processes=procs,
               numa_node=numa, cpus=tuple(range(numa * 8, numa * 8 + 8)), lost=lost)


def machine(gpus, link_of, *, findings=(), name="fake") -> Topology:
    """link_of(a, b) -> link class for every pair a < b."""
    links = tuple(Link(a.index, b.index, link_of(a.index, b.index))
                  for a, b in itertools.combinations(gpus, 2))
    numa = {}
    for g in gpus:
        numa.setdefault(g.numa_node, g.cpus)
    return Topology(gpus=tuple(gpus), links=links, hostname=name, driver_version="570.00",
                    nccl_version="2.27.3", numa_nodes=numa, findings=tuple(findings),
                    source=f"fake:{name}")


def nv_pair(**kw) -> Topology:
    return machine([gpu(0, **kw), gpu(1, **kw)], lambda a, b: "NV18", name="h200-nv18-pair")


def pcie_pair(link="PHB", total_gib=16, **kw) -> Topology:
    return machine([gpu(0, total_gib=total_gib, name="RTX 4070 Ti SUPER", **kw),
                    gpu(1, total_gib=total_gib, name="RTX 4070 Ti SUPER", **kw)],
                   lambda a, b: link, name="pcie-phb-pair")


def nvswitch8() -> Topology:
    """8 GPUs, all-to-all NV18 through NVSwitch, GPU0-3 on NUMA 0 and GPU4-7 on NUMA 1."""
    return machine([gpu(i, numa=i // 4) for i in range(8)], lambda a, b: "NV18",
                   name="nvswitch-8gpu")


def dual_socket() -> Topology:
    """4 GPUs: 0,1 behind one switch on socket 0, 2,3 on socket 1; across sockets SYS."""
    def link(a, b):
        return "PIX" if a // 2 == b // 2 else "SYS"
    return machine([gpu(i, numa=i // 2, total_gib=48) for i in range(4)], link,
                   name="dual-socket-sys")


def pcie4() -> Topology:
    """4 GPUs on one socket: PIX pairs (0,1) and (2,3), PXB across the pairs."""
    return machine([gpu(i, total_gib=24) for i in range(4)],
                   lambda a, b: "PIX" if a // 2 == b // 2 else "PXB", name="pcie-4gpu-x8")


def critical(i: int) -> Finding:
    return Finding(Severity.CRITICAL, "ecc_uncorrected", f"GPU{i} has 3 uncorrected ECC errors",
                   gpu=i)


def fixture(name: str) -> Topology | None:
    """The topology layer's JSON fixture as a Topology, or None until it exists."""
    path = FIXTURES / f"{name}.json"
    if not path.exists():
        return None
    from smartlaunch.topology import fake
    return fake.from_json(str(path), {})


def profile(*, params=6_900_000, step_ms=2.4, batch=64, backward_share=0.6, peak_gib=4.0,
            slack_ms=None, status=ProfileStatus.OK, steps_measured=20, **kw) -> ModelProfile:
    """A GPU dry run's profile. slack_ms: how far its host ran ahead of the device (None: not
    known, as a profile cached before it was measured; 0: launch-bound)."""
    step = step_ms / 1e3 if step_ms is not None else None
    kw.setdefault("host_slack_s", slack_ms / 1e3 if slack_ms is not None else None)
    return ModelProfile(
        status=status, total_params=params, trainable_params=params,
        param_dtypes={"float32": params}, grad_bytes=4 * params, num_grad_tensors=12,
        batch_size=batch, step_time_s=step, step_time_p90_s=step and step * 1.05,
        backward_s=step * backward_share if step and backward_share else None,
        forward_s=step * 0.3 if step else None, steps_measured=steps_measured,
        peak_gpu_mem_bytes=int(peak_gib * GiB) if peak_gib else None, dry_run_s=7.5,
        device="cuda:0 (NVIDIA H200)", **kw)


def curve(n: int, busbw: float, latency_s: float = 30e-6, gpus=()) -> CommCurve:
    algbw = busbw / (2 * (n - 1) / n)
    pts = [(2 ** k, latency_s + 2 ** k / algbw) for k in range(10, 31, 2)]
    return CommCurve.from_points(n, "nccl", pts, gpus=tuple(gpus))


class FakeComm:
    """comm_for: a curve by the group's worst link family; records which groups were asked."""

    def __init__(self, topology: Topology, busbw: dict | None = None, missing=()):
        self.topology, self.busbw = topology, {**BUSBW, **(busbw or {})}
        self.missing = set(missing)
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, group):
        self.calls.append(tuple(group))
        if tuple(group) in self.missing:
            return None
        fam = link_family(self.topology.worst_link(group).link_class)
        busbw = self.busbw[fam]
        widths = [self.topology.gpu(i).pcie_width for i in group]
        full = [self.topology.gpu(i).pcie_width_max for i in group]
        if fam != "NV" and all(widths) and all(full):
            # Without NVLink a ring runs at its slowest hop: an x8 GPU halves the group's busbw.
            busbw *= min(widths) / max(full)
        return curve(len(group), busbw, gpus=group)


class FakeTrial:
    """A decide.api.Trial: samples/s per (strategy name, n) from a table; records the
    candidates tried and the size of each round decide announced."""

    def __init__(self, rates: dict):
        self.rates = rates
        self.calls = []
        self.rounds = []

    def planned(self, n: int) -> None:
        self.rounds.append(n)

    def __call__(self, strategy, gpus, attempt=1):
        """A rate from the table; a list there gives its attempt-th entry (the last beyond)."""
        self.calls.append(Candidate(strategy, tuple(gpus)))
        got = self.rates.get((strategy_name(strategy), len(gpus)))
        return got[min(attempt, len(got)) - 1] if isinstance(got, list) else got


def policy(**decision) -> Policy:
    return Policy(decision=dataclasses.replace(DecisionPolicy(), **decision))


def request(**kw) -> Request:
    return Request(script="train.py", **kw)


# Scenario tests pin the cost model's constants: calibrating the defaults on real GPUs must
# not move a scenario across the policy's thresholds.
from smartlaunch.decide.cost import CostModel  # noqa: E402

TEST_MODEL = CostModel(compute_slowdown=1.05, ddp_overhead_s=0.1e-3, contention_s_per_byte=0.0,
                       per_tensor_s=0.0)
# The constants the scenarios' numbers were written against (the 2x H200 fit of run suite-s2):
# the helpers' default, so a refit of the shipped constants moves no scenario.
SCENARIO_MODEL = CostModel(ddp_overhead_s=0.4e-3, per_tensor_s=0.0)


def decide(request, topology, policy, profile, *, units, comm_for, trial=None,
           unavailable=frozenset(), model=SCENARIO_MODEL, launched=None, environ=None,
           wait_reason=""):
    """Steps 4-5 of smartlaunch.decide (the candidates, their predictions and the choice) for a
    given profile and GPUs left out, every curve and trial asked of `comm_for` and `trial`
    (FakeComm, FakeTrial): the Plan before its workers' environment and bindings
    (decide/prepare.py) and before the reasons the driver adds. What the scenario tests of the
    choice need; the whole step, with its Needs, is decide.decide's (test_decide_step.py)."""
    import importlib
    from smartlaunch.decide.api import Inputs, Measured, NeedCurve, TrialResult
    D = importlib.import_module("smartlaunch.decide.decide")   # the module, not the function
    inputs = Inputs(request, topology, policy, units, environ or {}, model,
                    launched=launched or {})
    measured, rounds = Measured(), []
    while True:
        try:
            return D._choose(inputs, profile, frozenset(unavailable), trials=trial is not None,
                             wait_reason=wait_reason, measured=measured)
        except D._Needed as e:
            need = e.need
            if isinstance(need, NeedCurve):
                measured = measured.add(need, comm_for(need.gpus))
                continue
            if need.of > (rounds[-1] if rounds else 0):      # a round announced (planned)
                rounds.append(need.of)
                trial.planned(need.of - need.number + 1)
            rate = trial(need.strategy, need.gpus, need.attempt) if need.attempt > 1 else \
                trial(need.strategy, need.gpus)
            why = getattr(trial, "why", {}).get(need.key, "") if rate is None else ""
            measured = measured.add(need, TrialResult(rate, why))
