"""The explain text, against golden files.

Regenerate after an intended change (then read the diff):
    SMARTLAUNCH_REGEN_GOLDEN=1 pytest tests/test_decide_explain.py
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from helpers_decide import (
    FakeComm, FakeTrial, dual_socket, nv_pair, pcie4, pcie_pair, policy, profile, request,
)
from smartlaunch.decide import EnvVar, NumaBinding
from helpers_decide import decide as _decide
from smartlaunch.decide.explain import cpu_ranges, render_text
from smartlaunch.decide.prepare import prepare
from smartlaunch.topology.api import cpu_only
from smartlaunch.strategies import REGISTRY

GOLDEN = Path(__file__).resolve().parent / "golden"
# Read at import: the clean_env fixture removes SMARTLAUNCH_* variables.
REGEN = os.environ.get("SMARTLAUNCH_REGEN_GOLDEN") == "1"
GPT = dict(params=163_000_000, step_ms=21.0)

import functools  # noqa: E402

from helpers_decide import TEST_MODEL  # noqa: E402

decide = functools.partial(_decide, model=TEST_MODEL, units=REGISTRY)


def _ddp_nvlink():
    plan = decide(request(), nv_pair(), policy(), profile(**GPT), comm_for=FakeComm(nv_pair()))
    return dataclasses.replace(
        plan, env=(EnvVar("NCCL_DEBUG", "WARN", "kept from environment"),),
        numa=(NumaBinding(0, 0, 0, tuple(range(8)), "node", "numactl"),
              NumaBinding(1, 1, 0, tuple(range(8)), "node", "numactl")))


def _single_pcie():
    topo = pcie_pair("PHB")
    plan = decide(request(), topo, policy(), profile(**GPT, peak_gib=9.8), comm_for=FakeComm(topo))
    return prepare(plan, topo, policy(), {}, units=REGISTRY, numactl="")  # the fallback GPU's binding too


def _trial():
    topo = dual_socket()
    return decide(request(max_gpus=2), topo, policy(), profile(), comm_for=FakeComm(topo),
                  trial=FakeTrial({("single", 1): 20000.0, ("ddp", 2): 31000.0}))


def _independent():
    plan = decide(request(variants=(("--lr", "0.1"), ("--lr", "0.01"))), pcie4(), policy(),
                  profile(), comm_for=FakeComm(pcie4()))
    return prepare(plan, pcie4(), policy(), {}, units=REGISTRY, numactl="")  # a binding per GPU


def _fallback_cpu():
    return decide(request(max_gpus=2), cpu_only("NVML library not found"), policy(), None,
                  comm_for=lambda g: None)


def _no_profile():
    return decide(request(), nv_pair(), policy(), None, comm_for=FakeComm(nv_pair()))


CASES = {"ddp-nvlink": _ddp_nvlink, "single-pcie": _single_pcie, "trial": _trial,
         "independent": _independent, "cpu": _fallback_cpu, "no-profile": _no_profile}


@pytest.mark.parametrize("name", sorted(CASES))
def test_explain_text_matches_golden(clean_env, name):
    text = render_text(CASES[name](), REGISTRY)
    path = GOLDEN / f"explain-{name}.txt"
    if REGEN:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), "regenerate with SMARTLAUNCH_REGEN_GOLDEN=1 if intended"


def test_explain_leads_with_the_plan_and_shows_the_numbers(clean_env):
    plan = _ddp_nvlink()
    text = render_text(plan, REGISTRY)
    first = text.splitlines()[0]
    assert "DDP×2 on GPUs 0,1" in first and "NV18" in first
    win = [c for c in plan.candidates if c.chosen][0]
    assert f"{win.speedup:.2f}×" in text and "163.0M params" in text
    assert "NCCL_DEBUG=WARN  (kept from environment)" in text
    assert "CPUs 0-7" in text and "decision.min_efficiency=0.7 (built-in)" in text


def test_explain_says_a_trial_was_killed_instead_of_calling_it_start_up(clean_env):
    # profile.trial.trial_phases: a trial the time limit ended with no step is "killed", not
    # "start"; the pipeline adds each trial's split to the timings as trials_<phase>.
    split = {"trials_start": 1.5, "trials_setup": 0.5, "trials_steps": 0.8, "trials_exit": 0.2,
             "trials_killed": 15.0}
    plan = dataclasses.replace(_ddp_nvlink(), timings={"total": 20.0, "trials": 18.0, **split})
    assert "decided in 20.00 s (trials 18.00 [start-up 1.50, script set-up 0.50, steps 0.80, " \
           "exit 0.20, killed at the time limit after 15.00 s])" in render_text(plan, REGISTRY)


def test_cpu_ranges():
    assert cpu_ranges((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    assert cpu_ranges(()) == "none"


def test_explain_shows_where_jobs_go_and_the_lease_wait(clean_env):
    sweep = request(variants=(("a",), ("b",)))
    cpu = render_text(decide(sweep, cpu_only("no NVML"), policy(), None, comm_for=lambda g: None),
                      REGISTRY)
    assert "jobs at once: 1 on the CPU" in cpu and "leases:" not in cpu
    packed = dataclasses.replace(_independent(), jobs_per_gpu={0: 2, 1: 1})
    assert "jobs at once: GPU0 2, GPU1 1" in render_text(packed, REGISTRY)
    single = decide(request(no_wait=True), pcie_pair("PHB"), policy(), None,
                    comm_for=lambda g: None)
    text = render_text(single, REGISTRY)
    assert "fallback GPUs (if GPU0 is taken before the lease): GPU1" in text
    assert "leases: --no-wait: fails at once, naming the holders, if another launch holds " \
           "its GPUs" in text


def test_unknown_values_are_left_out_or_named_not_shown_as_placeholders(clean_env):
    # A CPU profile has no peak memory: the profile line leaves it out ("peak ??" before).
    plan = dataclasses.replace(_ddp_nvlink(), profile=profile(**GPT, peak_gib=None))
    text = render_text(plan, REGISTRY)
    assert "peak" not in text.splitlines()[1] and "??" not in text.splitlines()[1]
    # A binding with no NUMA node says it is not pinned, not "NUMA node -1, CPUs none".
    text = render_text(_single_pcie(), REGISTRY)
    assert "NUMA node -1" not in text and "via none" not in text
    assert "  local rank 0 → GPU0, not pinned" in text.splitlines()
    # A policy key left at null shows the value in force, not Python's None.
    text = render_text(_trial(), REGISTRY)
    assert "=None" not in text
    assert "[decision.uncertainty_band=0.4 (built-in: the cost model's measured error)]" in text
    assert policy().rule("decision.max_gpus") == "decision.max_gpus=null (built-in)"


def test_a_note_every_binding_shares_is_said_once(clean_env):
    # numactl missing: one line for the launch, not one per rank.
    topo = dual_socket()
    plan = decide(request(strategy="ddp", max_gpus=4), topo, policy(), profile(),
                  comm_for=FakeComm(topo))
    text = render_text(prepare(plan, topo, policy(), {}, units=REGISTRY, numactl=""), REGISTRY)
    numa = text.split("NUMA binding:\n", 1)[1].splitlines()
    assert text.count("numactl not installed") == 1, numa
    assert "  every binding: numactl not installed: CPU affinity only, memory not bound" in numa
    ranks = [line for line in numa if line.startswith("  local rank")]
    assert len(ranks) == len(plan.gpus) >= 2 and all("via sched_setaffinity" in r for r in ranks)


def _comm_line(points, grad_bytes):
    from types import SimpleNamespace
    from smartlaunch.decide.describe import comm_summary
    from smartlaunch.profile.api import CommCurve
    curve = CommCurve.from_points(2, "gloo", points, gpus=(0, 1))
    summary = comm_summary(curve, SimpleNamespace(grad_bytes=grad_bytes))
    plan = dataclasses.replace(_no_profile(), comm=summary)
    line = next(x for x in render_text(plan, REGISTRY).splitlines() if x.startswith("all-reduce"))
    return line, summary


KiB, MiB = 1 << 10, 1 << 20
CPU_CURVE = [(64 * KiB << i, 200e-6 + (64 * KiB << i) / 1.2e9) for i in range(5)]  # to 1 MiB


def test_the_all_reduce_line_shows_only_measured_sizes(clean_env):
    # Was "busbw 1.2 GB/s at 256 MiB" from a curve measured up to 1 MiB (the fit's guess).
    line, c = _comm_line(CPU_CURVE, 1_000_000)
    assert "256 MiB" not in line and c.busbw_256MiB_GBps is None
    assert "busbw 1.0 GB/s at 1 MiB, the largest measured, 1.0 GB/s at the gradient size, " \
           "latency 200 µs" in line
    assert (c.busbw_largest_GBps, c.busbw_at_grad_GBps, c.latency_us) == (0.976, 0.968, 200.0)


@pytest.mark.parametrize("grad, says", [
    (10_000, "no figure at the gradient size (9.77 KiB, below the smallest measured, 64 KiB)"),
    (300 * MiB, "no figure at the gradient size (300 MiB, above the largest measured, 1 MiB)"),
])
def test_a_gradient_size_outside_the_curve_has_no_figure_and_says_why(clean_env, grad, says):
    # Was "0.0 GB/s at the gradient size": the fit's latency over a 10 KB message.
    line, c = _comm_line(CPU_CURVE, grad)
    assert says in line and "0.0 GB/s" not in line and c.busbw_at_grad_GBps is None


def test_an_implausible_fitted_latency_gives_way_to_the_smallest_size(clean_env):
    # Was "latency 19734 µs": a curve that is not straight fits an intercept above (or at 0,
    # below) anything measured; the smallest size's own time is shown, as such.
    bent = [(1 * MiB, 1e-3), (2 * MiB, 1.1e-3), (4 * MiB, 30e-3), (8 * MiB, 60e-3)]
    line, c = _comm_line(bent, 3 * MiB)
    assert c.latency_us is None and "latency" not in line
    assert line.endswith("1000 µs for 1 MiB, the smallest measured size")


def test_slow_links_are_not_rounded_to_zero(clean_env):
    slow = [(64 * KiB << i, 0.2 + (64 * KiB << i) / 1e6) for i in range(3)]
    line, c = _comm_line(slow, 100 * KiB)
    assert "0.0 GB/s" not in line and "busbw 0.00057 GB/s at 256 KiB" in line
    assert c.busbw_largest_GBps == 0.000567


def test_the_decision_line_says_the_policy_floor_refused_ddp(clean_env):
    from smartlaunch.decide.explain import decision_line
    topo = dual_socket()
    plan = decide(request(max_gpus=2), topo, policy(), profile(), comm_for=FakeComm(topo),
                  trial=FakeTrial({("single", 1): 20000.0, ("ddp", 2): 23200.0}))
    assert plan.strategy.value == "single"
    line = decision_line(plan, REGISTRY, floor=0.7)
    assert "— DDP×2 measured 1.16× one GPU (58%, below the policy's 70%)" in line, line
    # without the floor (a caller that does not pass it): the efficiency, no claim about why
    assert "DDP×2 measured 1.16× one GPU (58% efficiency)" in decision_line(plan, REGISTRY)


def test_explain_shows_how_far_the_host_ran_ahead_of_the_gpu():
    # the number the cost model hides DDP's host work behind (decide/cost.py, `hidden`)
    from helpers_decide import profile
    from smartlaunch.decide.explain import _profile
    assert "host 0.41 ms ahead of the GPU" in _profile(profile(slack_ms=0.41))[0]
    assert "ahead of the GPU" not in _profile(profile())[0]            # cached before it was measured
    on_cpu = dataclasses.replace(profile(slack_ms=0.0), device="cpu")
    assert "ahead of the GPU" not in _profile(on_cpu)[0]
