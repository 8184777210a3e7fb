"""A sweep (--each) split over the nodes: two "nodes" on this host (helpers_multinode.Cluster,
the `cluster` fixture in conftest.py), real launchers, the c10d rendezvous (or static with
--node-rank). The deciding node splits the variants (decide/nodes.py) and every node runs its
share as a one-node sweep: each variant exactly once, with its index in the whole sweep."""
from __future__ import annotations

import json
import re

import pytest

from helpers_multinode import START_S, fake, smartlaunch_lines
from smartlaunch.errors import ExitCode

SWEEP = ("--each", "--lr 0.1", "--each", "--lr 0.01", "--each", "--lr 0.001")
GPU = "pcie-phb-4070ti-pair"         # two GPUs a node: no DDP group per variant, no dry run


def runs(out) -> list[dict]:
    """Every variant run's record (helpers_multinode.EACH_SCRIPT), by index."""
    return sorted((json.loads(p.read_text()) for p in out.glob("variant-*.json")),
                  key=lambda r: (r["index"], r["node"]))


def start(c, out, variants=SWEEP, env=None, **kw):
    out.mkdir(exist_ok=True)
    return [c.launch(k, *variants, script=c.each, job=(str(out),), env=env, **kw)
            for k in range(c.n)]


@pytest.mark.parametrize("where", ["gpu", "cpu"])
def test_each_node_runs_its_share_once_with_the_sweeps_indices(cluster, tmp_path, where):
    # 3 variants over 2 nodes: node 0 (the deciding one) runs 0 and 1, node 1 runs 2. On the
    # GPU nodes variant 0 fails: node 0 still runs variant 1 and exits 1, node 1 exits 0.
    c = cluster(2)
    out = tmp_path / "out"
    sweep = SWEEP if where == "cpu" else ("--each", "--lr 0.1 --fail", *SWEEP[2:])
    nodes = start(c, out, sweep, env=fake(GPU) if where == "gpu" else None)
    codes = [node.wait(START_S) for node in nodes]
    want = [ExitCode.WORKER_FAILED if where == "gpu" else 0, 0]
    assert codes == want, "\n---\n".join(node.output_tail() for node in nodes)
    got = [(r["index"], r["jobs"], r["node"], r["args"]) for r in runs(out)]
    assert got == [(0, 3, 0, sweep[1].split()), (1, 3, 0, ["--lr", "0.01"]),
                   (2, 3, 1, ["--lr", "0.001"])], got
    for k, node in enumerate(nodes):
        first = next(line for line in smartlaunch_lines(node) if "independent" in line)
        share = "variants 0-1 of 3" if k == 0 else "variant 2 of 3"
        assert re.match(rf"smartlaunch: \d independent (single-GPU jobs? on GPUs? [\d,]+|jobs? on "
                        rf"the CPU) \({share}: this node's share\) — a sweep split over 2 nodes",
                        first), first
        assert "Traceback" not in node.output
    assert re.search(r"job 0 \(--lr 0.1 --fail\) failed: exit code 3" if where == "gpu" else
                     r"independent jobs: 2 of 2 succeeded", nodes[0].output), nodes[0].output
    assert "independent jobs: 1 of 1 succeeded" in nodes[1].output, nodes[1].output
    assert c.left_running() == []


def test_explain_prints_the_one_split_on_every_node(cluster, tmp_path):
    c = cluster(2)
    nodes = start(c, tmp_path / "out", SWEEP + ("--explain",))
    assert [node.wait(START_S) for node in nodes] == [0, 0], nodes[0].output_tail()
    for k, node in enumerate(nodes):
        text = node.output
        assert "3 variants split over 2 nodes (2/1, in order)" in text, text
        marks = ["", ""]
        marks[k] = " ← this node"
        assert (f"variants by node (2 nodes):\n  node 0: variants 0-1{marks[0]}\n"
                f"  node 1: variant 2{marks[1]}\n") in text, text
    assert list((tmp_path / "out").iterdir()) == []          # nothing ran
    assert c.left_running() == []


def test_a_node_without_a_share_exits_0_with_one_line(cluster, tmp_path):
    c = cluster(2)
    out = tmp_path / "out"
    nodes = start(c, out, ("--each", "--lr 0.1"))
    assert [node.wait(START_S) for node in nodes] == [0, 0], nodes[1].output_tail()
    assert [(r["index"], r["jobs"], r["node"]) for r in runs(out)] == [(0, 1, 0)]
    lines = smartlaunch_lines(nodes[1])
    assert lines == [f"smartlaunch: this node is not used: the sweep's 1 variant(s) are split "
                     f"over 1 of its 2 nodes, one share each (decided on {c.hostnames[0]}), "
                     f"and none is left for this node"], nodes[1].output
    assert c.left_running() == []


def test_a_node_whose_hardware_differs_exits_12_and_the_others_run_their_share(cluster,
                                                                               tmp_path):
    c = cluster(2)
    out = tmp_path / "out"
    nodes = [c.launch(k, *SWEEP, script=c.each, job=(str(out),),
                      env=fake(GPU) if k == 1 else None) for k in range(2)]
    out.mkdir()
    assert nodes[1].wait(START_S) == ExitCode.NODE_MISMATCH, nodes[1].output_tail()
    assert nodes[0].wait(START_S) == 0, nodes[0].output_tail()
    lines = smartlaunch_lines(nodes[1])
    assert len(lines) == 1 and lines[0].endswith(
        "start it separately on each kind of node; the other nodes run their shares of the "
        "sweep, this node's variants do not run"), lines
    assert [(r["index"], r["node"]) for r in runs(out)] == [(0, 0), (1, 0)]
    assert c.left_running() == []


def test_the_deciding_node_starts_nothing_when_a_node_never_takes_its_share(cluster, tmp_path):
    c = cluster(2)
    out = tmp_path / "out"
    out.mkdir()
    node = c.launch(0, *SWEEP, script=c.each, job=(str(out),), join_timeout=3)
    assert node.wait(START_S) == ExitCode.RENDEZVOUS, node.output_tail()
    lines = smartlaunch_lines(node)
    assert len(lines) == 2 and "Traceback" not in node.output, node.output   # status, error
    assert lines[1] == (f"smartlaunch: error: only 0 of the other 1 node(s) took their share of "
                        f"the sweep at {c.endpoint} (rdzv id job-{c.tag}) within join_timeout=3 "
                        f"s, so the others' variants would not run; none was started here (those "
                        f"that came run theirs): start smartlaunch on every node (--nnodes 2)")
    assert runs(out) == []
    assert c.left_running() == []


def test_with_the_static_rendezvous_each_node_runs_the_share_of_its_node_rank(cluster, tmp_path):
    c = cluster(2)
    out = tmp_path / "out"
    nodes = start(c, out, static=True)
    assert [node.wait(START_S) for node in nodes] == [0, 0], nodes[0].output_tail()
    assert [(r["index"], r["jobs"], r["node"]) for r in runs(out)] == [(0, 3, 0), (1, 3, 0),
                                                                       (2, 3, 1)]
    assert c.left_running() == []
