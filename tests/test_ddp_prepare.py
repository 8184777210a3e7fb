"""prepare(): NCCL variables by link class and NUMA bindings per local rank (fake topologies),
plus the pure parts of the watchdog (progress records, stack parsing, stragglers, /proc)."""
from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import time

import pytest

from smartlaunch.decide.plan import Plan, Strategy
from smartlaunch.errors import PolicyError
from smartlaunch.decide import prepare as plan_numa
from smartlaunch.decide.plan import NumaBinding
from smartlaunch.decide.prepare import nccl_env
from smartlaunch.decide.prepare import prepare as _prepare
from smartlaunch.launch import numa, stacks
from smartlaunch.proc import proc_state
from smartlaunch.launch.progress import ProgressWriter, read_progress
from smartlaunch.launch.watchdog import find_straggler, gpu_health_text
from smartlaunch.launch.worker import worker_command
from smartlaunch.policy.api import LaunchPolicy, Policy
from smartlaunch.request import Request
from smartlaunch.topology.api import GPU, Link, Topology
from smartlaunch.topology.fake import from_json
from smartlaunch.strategies import REGISTRY
from helpers_common import fixture_path

prepare = functools.partial(_prepare, units=REGISTRY)


def topo(name: str) -> Topology:
    return from_json(fixture_path(name), {})


def ddp_plan(gpus, link_class, strategy=Strategy.DDP) -> Plan:
    return Plan(strategy=strategy, device="cuda", gpus=tuple(gpus), nproc_per_node=len(gpus),
                requested_max=len(gpus), link_class=link_class)


def policy(**launch) -> Policy:
    return Policy(launch=LaunchPolicy(**launch))


# ---- NCCL -------------------------------------------------------------------------------------
def test_phb_pair_gets_policy_nccl_with_source(clean_env):
    plan = prepare(ddp_plan((0, 1), "PHB"), topo("pcie-phb-4070ti-pair"), policy(), {})
    env = {e.name: e for e in plan.env}
    assert env["NCCL_ALGO"].value == "Tree"
    assert env["NCCL_ALGO"].source.startswith("policy launch.nccl.PHB")


def test_environment_wins_over_policy_and_says_so(clean_env):
    plan = prepare(ddp_plan((0, 1), "PHB"), topo("pcie-phb-4070ti-pair"), policy(),
                   {"NCCL_ALGO": "Ring"})
    algo = next(e for e in plan.env if e.name == "NCCL_ALGO")
    assert algo.value == "Ring" and algo.source.startswith("kept from environment")


def test_admin_enforced_wins_over_environment():
    plan = ddp_plan((0, 1), "PHB")
    out = {e.name: e for e in nccl_env(plan, topo("pcie-phb-4070ti-pair"), policy(),
                                       {"NCCL_ALGO": "Ring"}, enforced={"NCCL_ALGO": "Tree"})}
    assert (out["NCCL_ALGO"].value, out["NCCL_ALGO"].source) == ("Tree", "admin enforce")


@pytest.mark.parametrize("level, dropped", [("0", True), ("1", False), ("2", False),
                                            ("LOC", True), ("NVL", True), ("PIX", False)])
def test_p2p_level_reads_nccls_legacy_integers(level, dropped):
    # NCCL: 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4+ SYS. "1" keeps P2P over a PIX switch; read as NVLink
    # it was dropped as disabling the pair's working P2P.
    pol = policy(nccl={"PIX": {"NCCL_P2P_LEVEL": level}})
    env = nccl_env(ddp_plan((0, 1), "PIX"), topo("pcie-4gpu-x8"), pol, {}, enforced={})
    assert ("NCCL_P2P_LEVEL" not in {e.name for e in env}) == dropped


def test_nvls_never_turned_on():
    nccl = {"NV": {"NCCL_NVLS_ENABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "LOC"}}
    pol = policy(nccl=nccl)
    plan = ddp_plan((0, 1), "NV18")
    names = {e.name: e.value for e in nccl_env(plan, topo("h200-nv18-pair"), pol, {},
                                               enforced={"NCCL_NVLS_ENABLE": "1"})}
    # NVLS on is refused even from the admin; P2P over the working NVLink is not disabled.
    assert names == {}
    kept = {e.name: e.value for e in nccl_env(plan, topo("h200-nv18-pair"), pol, {"NCCL_NVLS_ENABLE": "1"}, {})}
    assert kept == {"NCCL_NVLS_ENABLE": "1"}


def test_single_plan_gets_no_nccl(clean_env):
    plan = prepare(ddp_plan((0,), "PHB", Strategy.SINGLE), topo("pcie-phb-4070ti-pair"), policy(), {})
    assert plan.env == ()


# ---- NUMA -------------------------------------------------------------------------------------
def test_dual_socket_binds_each_rank_to_its_gpus_node():
    t = topo("dual-socket-sys")
    b = plan_numa.plan_bindings(ddp_plan((1, 0), "SYS"), t, "node", numactl="")
    assert [(x.local_rank, x.gpu, x.numa_node) for x in b] == [(0, 1, 1), (1, 0, 0)]
    assert b[0].cpus == t.gpu(1).cpus and b[0].mechanism == "sched_setaffinity"
    assert "memory not bound" in b[0].note
    b = plan_numa.plan_bindings(ddp_plan((0, 1), "SYS"), t, "node", numactl="/usr/bin/numactl")
    assert b[0].mechanism == "numactl"
    argv = numa.numactl_argv({"cpus": list(b[1].cpus), "node": 1}, ["python", "x.py"])
    assert argv[1:4] == ["--physcpubind=32-63", "--membind=1", "--"]


def test_a_single_jobs_fallback_gpus_are_bound_each_as_its_only_gpu():
    # The job moves to GPU1 when GPU0 is leased first: it must run on GPU1's node, and
    # exclusive-cores must not halve the node between GPU0 and a GPU the job never uses both of.
    t = topo("dual-socket-sys")
    one = dataclasses.replace(ddp_plan((0,), None, Strategy.SINGLE), fallback_gpus=(1,))
    plan = prepare(one, t, policy(numa_binding="exclusive-cores"), {}, numactl="")
    assert [(b.local_rank, b.gpu, b.numa_node) for b in plan.numa] == [(0, 0, 0), (0, 1, 1)]
    assert plan.binding(1).cpus == t.gpu(1).cpus and plan.binding(0).cpus == t.gpu(0).cpus
    assert plan.binding(2) is None


def test_the_users_torchrun_numa_binding_wins_and_explain_says_so(clean_env):
    t = topo("dual-socket-sys")
    plan = prepare(ddp_plan((0, 2), "SYS"), t, policy(), {}, numactl="", torchrun_numa="node")
    assert plan.numa == () and plan.reasons[-1].rule == "user: --numa-binding node"
    assert len(prepare(ddp_plan((0, 2), "SYS"), t, policy(), {}, numactl="").numa) == 2


def test_single_numa_node_is_a_noop_that_says_so():
    b = plan_numa.plan_bindings(ddp_plan((0, 1), "PHB"), topo("pcie-phb-4070ti-pair"), "node", numactl="")
    assert {(x.mechanism, x.note) for x in b} == {("none", plan_numa.SINGLE_NODE_NOTE)}
    assert numa.encode(b) == "[]"


def test_exclusive_cores_split_disjoint_and_keep_siblings_together():
    cpus = tuple(range(8)) + tuple(range(64, 72))
    gpus = tuple(GPU(index=i, nvml_index=i, uuid=f"GPU-{i}", name="x", pci_bus_id=str(i),
                     memory_total_mib=1, memory_free_mib=1, memory_used_mib=0, numa_node=0, cpus=cpus)
                 for i in range(2))
    t = Topology(gpus=gpus, links=(Link(0, 1, "NODE"),), numa_nodes={0: cpus, 1: (100,)})
    siblings = lambda c: (c, c + 64) if c < 64 else (c - 64, c)   # noqa: E731
    b = plan_numa.plan_bindings(ddp_plan((0, 1), "NODE"), t, "exclusive-cores", numactl="", siblings=siblings)
    assert set(b[0].cpus).isdisjoint(b[1].cpus)
    assert set(b[0].cpus) | set(b[1].cpus) == set(cpus)
    assert all((c + 64) in b[0].cpus for c in b[0].cpus if c < 64)


def test_bad_numa_mode_is_a_policy_error():
    with pytest.raises(PolicyError, match="numa_binding"):
        prepare(ddp_plan((0, 1), "SYS"), topo("dual-socket-sys"), policy(numa_binding="socket"), {})


def test_worker_applies_affinity_from_env(tmp_path):
    # The hook binds itself (no numactl here) before the script runs.
    cpu = sorted(os.sched_getaffinity(0))[0]
    script = tmp_path / "aff.py"
    script.write_text("import os; print(sorted(os.sched_getaffinity(0)))")
    env = {**os.environ, "LOCAL_RANK": "1", numa.ENV_VAR: numa.encode([
        NumaBinding(0, 0, 0, (cpu,), "node", "none"),
        NumaBinding(1, 1, 0, (cpu,), "node", "sched_setaffinity")])}
    out = subprocess.run(worker_command(Request(script=str(script)).worker_command(), sys.executable), env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"[{cpu}]"


# ---- watchdog parts ---------------------------------------------------------------------------
def test_progress_record_round_trip(tmp_path):
    w = ProgressWriter(tmp_path / "p.bin", local_rank=1, rank=3)
    assert read_progress(tmp_path / "p.bin").steps == 0
    for _ in range(3):
        w.step()
    w.exited(2)
    rec = read_progress(tmp_path / "p.bin")
    assert (rec.pid, rec.local_rank, rec.rank, rec.steps, rec.exit_code) == (os.getpid(), 1, 3, 3, 2)
    assert 0 < rec.t_first <= rec.t_last <= time.monotonic()


def test_top_frame_is_the_main_threads():
    dump = ('Current thread 0x1 (most recent call first):\n  File "/x/threading.py", line 9 in wait\n\n'
            'Thread 0x2 (most recent call first):\n  File "/home/u/train.py", line 42 in step\n'
            '  File "/home/u/train.py", line 50 in main\n')
    assert stacks.top_frame(dump) == "/home/u/train.py:42 in step"
    assert not stacks.in_library("/home/u/train.py:42 in step")
    assert stacks.in_library("/usr/lib/python3/site-packages/torch/distributed/c10d.py:1 in all_reduce")


def test_straggler_needs_threshold():
    assert find_straggler({0: 10.0, 1: 10.0, 2: 8.0}, 0.15) == 2
    assert find_straggler({0: 10.0, 1: 9.0}, 0.15) is None


def test_gpu_health_text_shows_unknowns():
    g = GPU(index=1, nvml_index=1, uuid="u", name="x", pci_bus_id="b", memory_total_mib=1,
            memory_free_mib=1, memory_used_mib=0, temperature_c=87, sm_clock_mhz=1410,
            sm_clock_max_mhz=1980, throttle_reasons=("hw_thermal_slowdown",))
    assert gpu_health_text(g) == ("GPU 1: 87 C, SM clock 1410/1980 MHz, power ??/?? W, "
                                  "throttle reasons: hw_thermal_slowdown")


def test_proc_state_reads_zombie_status():
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
    deadline = time.monotonic() + 10
    while proc_state(p.pid).state != "Z" and time.monotonic() < deadline:
        time.sleep(0.02)
    st = proc_state(p.pid)
    assert (st.state, st.exit_code, st.signal) == ("Z", 7, None)
    p.wait()
    assert proc_state(p.pid).state == "gone"


def test_worker_command_wraps_what_the_request_asked():
    req = Request(script="pkg.train", module=True)
    assert worker_command(req.worker_command(), "py") == ["py", "-u", "-m", "smartlaunch.launch.worker", "--module", "pkg.train"]
    assert dataclasses.replace(req, module=False, no_python=True).worker_command() == ("--no-python", "pkg.train")
