"""--each on more GPUs than variants: each variant a DDP×k group when that gives more aggregate
samples/s (decide/pack.py), and the launch of those groups side by side (launch/groups.py)."""
from __future__ import annotations

import dataclasses
import json
import os
import textwrap

import pytest

from helpers_decide import (  # noqa: I001
    TEST_MODEL, FakeComm, FakeTrial, dual_socket, fixture, nvswitch8, pcie4, policy, profile,
    request,
)
from smartlaunch.decide import Strategy
from helpers_decide import decide
from smartlaunch.decide.explain import render_text
from smartlaunch.decide.pack import disjoint_groups
from smartlaunch.decide.prepare import prepare
from smartlaunch.strategies import REGISTRY

GPT = dict(params=163_000_000, step_ms=21.0)
SMALL = dict(params=6_900_000, step_ms=30.0)


def sweep(n: int, **kw):
    return request(variants=tuple(("--lr", f"0.{i + 1}") for i in range(n)), **kw)


def run(topo, prof, req, pol=None, **kw):
    kw.setdefault("model", TEST_MODEL)
    comm = kw.pop("comm", None) or FakeComm(topo)
    return decide(req, topo, pol or policy(), prof, units=REGISTRY, comm_for=comm, **kw)


def groups(plan):
    return [g.gpus for g in plan.groups]


# ---- the choice ---------------------------------------------------------------------------
def test_efficient_ddp_packs_two_variants_as_ddp4_and_four_as_ddp2_on_eight_gpus(clean_env):
    plan = run(nvswitch8(), profile(**GPT), sweep(2))
    assert plan.strategy == Strategy.INDEPENDENT and plan.nproc_per_node == 4
    assert groups(plan) == [(0, 1, 2, 3), (4, 5, 6, 7)]      # one group per NUMA node
    assert [g.variant for g in plan.groups] == [0, 1] and plan.left_free == ()
    assert all(g.strategy == Strategy.DDP and g.link_class == "NV18" for g in plan.groups)
    win = [c for c in plan.candidates if c.chosen][0]
    assert win.per_variant == 4 and win.speedup == pytest.approx(
        sum(g.speedup for g in plan.groups))
    plan = run(nvswitch8(), profile(**GPT), sweep(4))
    assert plan.nproc_per_node == 2 and groups(plan) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    text = [r.text for r in plan.reasons if "4 variants on 8 usable GPUs" in r.text][0]
    assert "4 × DDP×2 on 0,1 | 2,3 | 4,5 | 6,7" in text and "4 single-GPU jobs give 4.00×" in text


def test_inefficient_ddp_keeps_one_gpu_per_variant_and_leaves_the_rest_free(clean_env):
    # GPT's 650 MB of gradients over PCIe/SYS: DDP×2 is predicted well below 70%.
    plan = run(dual_socket(), profile(**GPT), sweep(2))
    assert plan.strategy == Strategy.INDEPENDENT and plan.groups == ()
    assert plan.nproc_per_node == 1 and plan.gpus == (0, 1) and plan.left_free == (2, 3)
    text = [r.text for r in plan.reasons if "2 variants on 4 usable GPUs" in r.text][0]
    assert "below the policy's 70%" in text and "→ 2 single-GPU jobs on GPUs 0,1" in text
    packed = [c for c in plan.candidates if (c.per_variant or 1) > 1]
    assert [c.per_variant for c in packed] == [2] and not packed[0].chosen


def test_trials_decide_when_there_is_no_prediction(clean_env):
    """No profile: the DDP×2 group is measured by trial against one GPU, as the DDP choice
    would; the measured rate decides k."""
    for ddp2, want in ((190.0, 2), (120.0, 1)):       # 95% vs 60% efficiency
        trial = FakeTrial({("single", 1): 100.0, ("ddp", 2): ddp2})
        plan = run(pcie4(), None, sweep(2), trial=trial)
        assert plan.nproc_per_node == want
        assert [(c.strategy, c.gpus) for c in trial.calls] == [(Strategy.SINGLE, (0,)),
                                                                (Strategy.DDP, (0, 1))]
        win = [c for c in plan.candidates if c.chosen][0]
        assert win.measured and win.per_variant == want
        assert win.predicted_samples_per_s == pytest.approx(2 * (ddp2 if want == 2 else 100.0))
        if want == 2:
            assert [g.basis for g in plan.groups] == ["measured", "measured"]
            assert [g.speedup for g in plan.groups] == pytest.approx([1.9, 1.9])


def test_a_tie_in_aggregate_samples_per_second_goes_to_fewer_gpus(clean_env):
    # DDP×2 and DDP×4 measured alike: 2 variants get 2 GPUs each, not 4.
    trial = FakeTrial({("single", 1): 100.0, ("ddp", 2): 200.0, ("ddp", 4): 200.0})
    plan = run(nvswitch8(), None, sweep(2), policy(min_efficiency=0.4), trial=trial)
    assert plan.nproc_per_node == 2 and groups(plan) == [(0, 1), (2, 3)]
    assert plan.left_free == (4, 5, 6, 7)
    assert any("a tie: fewer GPUs win" in r.text for r in plan.reasons)
    trial = FakeTrial({("single", 1): 100.0, ("ddp", 2): 200.0, ("ddp", 4): 390.0})
    plan = run(nvswitch8(), None, sweep(2), policy(min_efficiency=0.4), trial=trial)
    assert plan.nproc_per_node == 4


def test_the_world_size_policy_bounds_k(clean_env):
    plan = run(nvswitch8(), profile(**GPT), sweep(2), policy(world_sizes=(1, 2)))
    assert plan.nproc_per_node == 2 and len(plan.gpus) == 4
    assert not any(c.per_variant == 4 for c in plan.candidates)
    plan = run(nvswitch8(), profile(**GPT), sweep(2), policy(world_sizes=(1, 4, 8)))
    assert plan.nproc_per_node == 4
    plan = run(pcie4(), profile(**SMALL), sweep(2), policy(world_sizes=(1, 4)))
    assert plan.groups == () and plan.gpus == (0, 1)        # 2 × 4 does not fit 4 GPUs
    plan = run(nvswitch8(), profile(**GPT), sweep(2), policy(allowed_strategies=(
        "single", "independent")))
    assert plan.groups == ()
    assert any("the policy does not allow DDP" in r.text for r in plan.reasons)


def test_more_variants_than_gpus_queue_on_single_gpus_and_a_forced_independent_never_packs(
        clean_env):
    plan = run(pcie4(), profile(**SMALL), sweep(5))
    assert plan.groups == () and plan.gpus == (0, 1, 2, 3) and plan.nproc_per_node == 1
    assert not any(c.per_variant and c.per_variant > 1 for c in plan.candidates)
    plan = run(nvswitch8(), profile(**GPT), sweep(2, strategy="independent"))
    assert plan.groups == () and plan.gpus == (0, 1)
    plan = run(nvswitch8(), profile(**GPT), sweep(2, max_gpus=4))      # --nproc-per-node 4
    assert plan.nproc_per_node == 2 and groups(plan) == [(0, 1), (2, 3)]


def test_a_dry_run_is_planned_only_when_the_variants_could_get_ddp_groups(clean_env):
    from smartlaunch.decide import decide as step
    from smartlaunch.decide.api import Inputs, Measured, NeedProfile

    def gpu(req, pol=None):
        """The GPU the step asks a dry run on, with no GPU leased elsewhere; None: none."""
        need = step(Inputs(req, pcie4(), pol or policy(), REGISTRY), Measured(leased=frozenset()))
        return need.gpu if isinstance(need, NeedProfile) else None
    assert gpu(sweep(2)) == 0                       # 2 × DDP×2 fits 4 GPUs: worth measuring
    assert gpu(sweep(3)) is None                    # 3 × 2 does not: one GPU each, as before
    assert gpu(sweep(2), policy(world_sizes=(1, 4))) is None
    assert gpu(sweep(2, strategy="independent")) is None


def test_groups_are_disjoint_best_linked_and_numa_aware(clean_env):
    topo = dual_socket()          # PIX pairs on each socket, SYS across
    assert disjoint_groups(topo, [0, 1, 2, 3], 2, 2, ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")) \
        == ((0, 1), (2, 3))
    assert disjoint_groups(topo, [0, 2, 3, 1], 2, 2, ("PIX",)) == ((0, 1), (2, 3))
    assert disjoint_groups(topo, [0, 1, 2], 2, 2, ("PIX",)) is None
    # An x8 GPU (pcie-4gpu-x8's GPU3) is predicted slower: the group holding it says so.
    x8 = fixture("pcie-4gpu-x8")
    plan = run(x8, profile(**SMALL), sweep(2))
    assert groups(plan) == [(0, 1), (2, 3)]
    assert plan.groups[1].speedup < plan.groups[0].speedup


def test_plan_json_and_explain_show_each_variants_group_with_its_numbers(clean_env):
    topo = nvswitch8()
    pol = policy()
    plan = prepare(run(topo, profile(**GPT), sweep(2), pol), topo, pol, {}, units=REGISTRY,
                   numactl="")
    d = json.loads(plan.to_json())
    assert [(g["variant"], g["gpus"], g["strategy"]) for g in d["groups"]] == [
        (0, [0, 1, 2, 3], "ddp"), (1, [4, 5, 6, 7], "ddp")]
    assert [b["local_rank"] for b in d["groups"][1]["numa"]] == [0, 1, 2, 3]
    assert [b["gpu"] for b in d["groups"][1]["numa"]] == [4, 5, 6, 7]
    assert {b["numa_node"] for b in d["groups"][1]["numa"]} == {1}
    text = render_text(plan, REGISTRY)
    assert text.startswith("smartlaunch: 2 variants, each as DDP×4 on its own group: "
                           "GPUs 0,1,2,3 | 4,5,6,7")
    assert "variant 1 (--lr 0.2): DDP×4 on GPUs 4,5,6,7 (worst link NV18), predicted" in text
    assert "local rank 0 → GPU4: NUMA node 1" in text
    assert "independent, DDP×4 each" in text and "independent, DDP×2 each" in text
    from smartlaunch.decide.explain import decision_line
    assert decision_line(plan, REGISTRY).startswith(
        "2 variants, each as DDP×4 on its own group: GPUs 0,1,2,3 | 4,5,6,7 — predicted ")
    assert "one GPU's samples/s in all; each variant's global batch 4 × 64 = 256" in \
        decision_line(plan, REGISTRY)
    one = plan.group_plan(1)
    assert one.strategy == Strategy.DDP and one.gpus == (4, 5, 6, 7) and one.nproc_per_node == 4
    assert one.command[-2:] == ("--lr", "0.2") and one.variants == () and one.groups == ()


def test_the_group_gets_the_nccl_table_of_its_own_link_class(clean_env):
    from smartlaunch.policy.api import LaunchPolicy
    topo = dual_socket()
    pol = dataclasses.replace(policy(), launch=LaunchPolicy(nccl={"PIX": {"NCCL_ALGO": "Ring"}}))
    plan = prepare(run(topo, profile(**SMALL), sweep(2), pol), topo, pol, {}, units=REGISTRY,
                   numactl="")
    assert groups(plan) == [(0, 1), (2, 3)]
    assert all(("NCCL_ALGO", "Ring") in [(e.name, e.value) for e in g.env] for g in plan.groups)
    assert "NCCL_ALGO" not in plan.env_dict()     # not the single-GPU jobs' business


# ---- the launch: real processes, gloo on the CPU -------------------------------------------
RANK_SCRIPT = textwrap.dedent("""
    import argparse, json, os, sys, time
    import torch, torch.distributed as dist
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--wait-for", default="")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1)
    dist.all_reduce(t)
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "MASTER_PORT",
            "SMARTLAUNCH_JOB_INDEX", "SMARTLAUNCH_NUM_JOBS")
    rec = {k: os.environ.get(k) for k in keys}
    rec.update(sum=float(t.item()), pid=os.getpid())
    path = os.path.join(a.out, f"{a.tag}-{rank}.json")
    with open(path + ".part", "w") as f:    # whole when the test sees it
        json.dump(rec, f)
    os.replace(path + ".part", path)
    if a.exit and rank == 1:
        open(os.path.join(a.out, f"failed-{a.tag}"), "w").close()
        os._exit(a.exit)
    if a.wait_for:             # still running when the other group fails
        deadline = time.time() + 120
        while not os.path.exists(os.path.join(a.out, a.wait_for)) and time.time() < deadline:
            time.sleep(0.05)
    if rank == 0:
        print(f"throughput: samples/s={10 * world} world={world}", flush=True)
    os._exit(0)
""")


@pytest.mark.slow
def test_two_variants_run_as_two_ddp2_groups_and_one_failing_leaves_the_other(clean_env,
                                                                             capsys):
    """2 variants × DDP×2 on a fake 4-GPU topology: each group its own world of 2 on its
    own GPUs and rendezvous; group 1's rank failing ends group 1 only."""
    from torch.distributed.run import get_args_parser
    from helpers_ddp import make_policy
    from smartlaunch.launch import execute
    from smartlaunch.launch.api import context
    from smartlaunch.launch.leases import LeaseManager
    from smartlaunch.request import Request
    topo = fixture("pcie-4gpu-x8")
    out = clean_env / "out"
    out.mkdir()
    script = clean_env / "rank.py"
    script.write_text(RANK_SCRIPT)
    variants = (("--tag", "a", "--wait-for", "failed-b"), ("--tag", "b", "--exit", "3"))
    ns = get_args_parser().parse_args([str(script), "--out", str(out)])
    req = Request(script=str(script), script_args=("--out", str(out)), torchrun_args=ns,
                  variants=variants)
    pol = make_policy(clean_env / "logs")
    plan = run(topo, profile(**SMALL), req, pol)
    plan = prepare(plan, topo, pol, os.environ, units=REGISTRY, numactl="")
    assert groups(plan) == [(0, 1), (2, 3)]

    rc = execute(plan, context(req, pol, topo), REGISTRY)

    assert rc == 1
    recs = {f.stem: json.loads(f.read_text()) for f in out.glob("*-*.json")}
    assert sorted(recs) == ["a-0", "a-1", "b-0", "b-1"]
    uuid = {g.uuid: g.index for g in topo.gpus}
    for tag, gpus, index in (("a", (0, 1), "0"), ("b", (2, 3), "1")):
        for r in (recs[f"{tag}-0"], recs[f"{tag}-1"]):
            assert r["WORLD_SIZE"] == "2" and r["sum"] == 2.0     # a world of its own two
            assert tuple(uuid[u] for u in r["CUDA_VISIBLE_DEVICES"].split(",")) == gpus
            assert (r["SMARTLAUNCH_JOB_INDEX"], r["SMARTLAUNCH_NUM_JOBS"]) == (index, "2")
    assert recs["a-0"]["MASTER_PORT"] != recs["b-0"]["MASTER_PORT"]
    (summary,) = (clean_env / "logs").glob("*/summary.json")
    jobs = json.loads(summary.read_text())["jobs"]
    assert [j["state"] for j in jobs] == ["succeeded", "failed"]
    assert jobs[0]["samples_per_s"] == 20.0 and jobs[1]["exit_code"] == 1
    err = capsys.readouterr().err
    assert "groups: 1 of 2 succeeded" in err
    assert "group 1: rank 1 (local 1" in err and "exit code 3" in err
    assert LeaseManager(os.environ["SMARTLAUNCH_LEASE_DIR"]).taken(topo) == set()


@pytest.mark.slow
def test_a_nodes_share_of_a_sweep_across_nodes_runs_in_the_first_shares_groups(clean_env):
    """3 variants over 2 nodes (decide/nodes.py): node 0's share of 2 is packed as 2 × DDP×2;
    node 1 runs its one variant, the sweep's variant 2, in the first group, with
    SMARTLAUNCH_JOB_INDEX 2 of SMARTLAUNCH_NUM_JOBS 3."""
    from torch.distributed.run import get_args_parser
    from helpers_ddp import make_policy
    from smartlaunch.decide.nodes import sweep_across_nodes
    from smartlaunch.launch import execute
    from smartlaunch.launch.api import context
    from smartlaunch.request import Request
    topo = fixture("pcie-4gpu-x8")
    out = clean_env / "out"
    out.mkdir()
    script = clean_env / "rank.py"
    script.write_text(RANK_SCRIPT)
    ns = get_args_parser().parse_args([str(script), "--out", str(out)])
    whole = Request(script=str(script), script_args=("--out", str(out)), torchrun_args=ns,
                    nnodes="2", variants=tuple(("--tag", t) for t in "abc"))
    pol = make_policy(clean_env / "logs")
    sweep = sweep_across_nodes(whole)
    plan = sweep.plan(run(topo, profile(**SMALL), sweep.request, pol))
    plan = prepare(plan, topo, pol, os.environ, units=REGISTRY, numactl="").for_node(1)
    assert [(g.variant, g.gpus) for g in plan.groups] == [(2, (0, 1))]

    assert execute(plan, context(whole, pol, topo), REGISTRY) == 0
    recs = {f.stem: json.loads(f.read_text()) for f in out.glob("*-*.json")}
    assert sorted(recs) == ["c-0", "c-1"]
    assert {(r["SMARTLAUNCH_JOB_INDEX"], r["SMARTLAUNCH_NUM_JOBS"], r["WORLD_SIZE"])
            for r in recs.values()} == {("2", "3", "2")}


DRIVER = textwrap.dedent("""
    import json, os, sys
    from torch.distributed.run import get_args_parser
    from helpers_decide import fixture, profile, FakeComm, TEST_MODEL
    from helpers_ddp import make_policy
    from helpers_decide import decide
    from smartlaunch.decide.prepare import prepare
    from smartlaunch.launch import execute
    from smartlaunch.launch.api import context
    from smartlaunch.request import Request
    from smartlaunch.strategies import REGISTRY
    script, out, logs = sys.argv[1:4]
    topo = fixture("pcie-4gpu-x8")
    variants = (("--tag", "a", "--wait-for", "never"), ("--tag", "b", "--wait-for", "never"))
    ns = get_args_parser().parse_args([script, "--out", out])
    req = Request(script=script, script_args=("--out", out), torchrun_args=ns, variants=variants)
    pol = make_policy(logs)
    plan = decide(req, topo, pol, profile(params=6_900_000, step_ms=30.0), units=REGISTRY,
                  comm_for=FakeComm(topo), model=TEST_MODEL)
    plan = prepare(plan, topo, pol, os.environ, units=REGISTRY, numactl="")
    assert len(plan.groups) == 2
    sys.exit(execute(plan, context(req, pol, topo), REGISTRY))
""")


@pytest.mark.slow
def test_sigterm_stops_every_group_and_exits_143(clean_env):
    import signal
    import subprocess
    import sys
    from helpers_common import wait_until
    from helpers_ddp import wait_gone
    out = clean_env / "out"
    out.mkdir()
    (clean_env / "rank.py").write_text(RANK_SCRIPT)
    (clean_env / "driver.py").write_text(DRIVER)
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": tests + os.pathsep + os.environ["PYTHONPATH"]}
    p = subprocess.Popen([sys.executable, str(clean_env / "driver.py"), str(clean_env / "rank.py"),
                          str(out), str(clean_env / "logs")], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(list(out.glob("*-*.json"))) == 4 or p.poll() is not None,
                   timeout=120, what="both groups' ranks")
        assert p.poll() is None, p.communicate()[1][-3000:]
        pids = [json.loads(f.read_text())["pid"] for f in out.glob("*-*.json")]
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert wait_gone(pids, 10) == []
    assert "groups: 0 of 2 succeeded" in err


def test_a_node_reading_the_plan_binds_each_groups_ranks_to_its_own_cpus(clean_env):
    # The deciding node's bindings name its CPUs and its environment is its own; a node that
    # reads the plan makes the plan's and every packed group's bindings and environment
    # itself (pipeline_nodes._prepared_here), as prepare() does, never the wire's.
    from types import SimpleNamespace

    from smartlaunch.decide.plan import EnvVar
    from smartlaunch.pipeline_nodes import _prepared_here
    topo, pol = nvswitch8(), policy()
    mine = prepare(run(topo, profile(**GPT), sweep(2), pol), topo, pol, {}, units=REGISTRY,
                   numactl="")
    evil = EnvVar("PYTHONPATH", "/tmp/evil", "the wire")
    theirs = dataclasses.replace(mine, env=mine.env + (evil,), groups=tuple(
        dataclasses.replace(g, env=g.env + (evil,), numa=tuple(
            dataclasses.replace(b, cpus=(999,)) for b in g.numa))
        for g in mine.groups))
    local = _prepared_here(theirs, topo, pol, SimpleNamespace(
        torchrun_args=SimpleNamespace(numa_binding=None)), {})
    assert [[b.cpus for b in g.numa] for g in local.groups] == \
        [[b.cpus for b in g.numa] for g in mine.groups]
    assert {b.cpus for g in local.groups for b in g.numa} != {(999,)}
    assert local.env == mine.env and [g.env for g in local.groups] == \
        [g.env for g in mine.groups]
    assert "PYTHONPATH" not in {e.name for g in local.groups for e in g.env}
