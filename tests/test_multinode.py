"""Multi-node jobs with real launchers: two and three "nodes" on this host, each smartlaunch in
a network namespace of its own (helpers_multinode.Cluster), c10d rendezvous on the first
node's hostname, gloo ranks. A job across nodes is launched as torchrun would on every node:
one job of world nodes × nproc-per-node, whatever the node (these have no GPU). The `cluster`
fixture is in conftest.py; a sweep split over the nodes: test_multinode_each.py."""
from __future__ import annotations

import re
import signal

import pytest

from helpers_multinode import (END_S, START_S, fake, printed_plan,
                               smartlaunch_lines)
from smartlaunch.errors import ExitCode


def ranks_seen(nodes) -> dict[int, tuple[int, int]]:
    """rank -> (world, node) from every `job: rank R world W node K` of every launcher. Not
    anchored to a line: ranks of one node print at once, and under python -u (torchrun's too)
    print() writes the text and its newline apart, so one rank's line may run into another's."""
    seen = {}
    for node in nodes:
        for m in re.finditer(r"job: rank (\d+) world (\d+) node (\d+)", node.output):
            seen[int(m[1])] = (int(m[2]), int(m[3]))
    return seen


@pytest.mark.parametrize("n", [2, 3])
def test_the_rendezvous_node_decides_and_the_others_run_its_plan(cluster, n):
    # Alike GPU nodes (one fixture): the plan node 0 makes is the one every node prints; the
    # followers name who made it and redo nothing but their NUMA bindings. Followers first:
    # they wait for the store, the decider serves its plan until they have read it.
    c = cluster(n)
    nodes = [c.launch(k, "--explain=json", env=fake("pcie-4gpu-x8")) for k in range(n - 1, -1, -1)]
    nodes.reverse()
    assert [node.wait(START_S) for node in nodes] == [0] * n, nodes[0].output_tail()
    plans = [printed_plan(node) for node in nodes]
    assert {p["topology"]["hostname"] for p in plans} == {"pcie-box"}     # the fixture's
    first = plans[0]
    assert any(r["text"].startswith("this node decides for every node of the job")
               for r in first["reasons"]), first["reasons"]
    for k, p in enumerate(plans[1:], 1):
        assert p["strategy"] == first["strategy"] == "ddp" and p["gpus"] == first["gpus"]
        assert p["reasons"][:-1] == first["reasons"], k
        assert p["reasons"][-1]["text"].startswith(f"the plan {c.hostnames[0]} made for every "
                                                   f"node of the job"), p["reasons"][-1]
        assert p["topology"]["hardware_fingerprint"] == first["topology"]["hardware_fingerprint"]
    assert c.left_running() == []


def test_a_node_whose_hardware_differs_refuses_the_plan_and_the_job_ends(cluster):
    # Node 0 (no GPU) decides a CPU plan; node 1 has two GPUs (a fixture): it says so in one
    # line and exits 12 without starting a rank, and closes the rendezvous so node 0 ends
    # at once, not at the join timeout (here 90 s, longer than the test's wait).
    c = cluster(2)
    decider = c.launch(0, "--nproc-per-node", "1", join_timeout=90)
    other = c.launch(1, "--nproc-per-node", "1", join_timeout=90,
                     env=fake("pcie-phb-4070ti-pair"))
    assert other.wait(START_S) == ExitCode.NODE_MISMATCH == 12, other.output_tail()
    lines = smartlaunch_lines(other)
    assert len(lines) == 1 and "Traceback" not in other.output, other.output
    assert re.fullmatch(
        rf"smartlaunch: error: this node \({c.hostnames[1]}: 2× NVIDIA GeForce RTX 4070 Ti SUPER "
        rf"\(\d+ MiB\), links PHB\) differs from the node the job's plan was made on "
        rf"\({c.hostnames[0]}: no GPUs; hardware fingerprints \w+ and \w+\); run the job on "
        rf"nodes with the same GPUs and links, or start it separately on each kind of node; "
        rf"the rendezvous was closed, so the other nodes end too", lines[0]), lines[0]
    assert "job: rank" not in other.output
    assert decider.wait(60) == ExitCode.RENDEZVOUS, decider.output_tail()
    assert "is closed: another node ended the job" in decider.output, decider.output
    assert "job: rank" not in decider.output
    assert c.left_running() == []


def test_the_deciding_nodes_error_ends_every_node_with_its_code(cluster):
    c = cluster(2)
    nodes = [c.launch(k, "--nproc-per-node", "3", env=fake("pcie-phb-4070ti-pair"))
             for k in range(2)]
    assert [node.wait(START_S) for node in nodes] == [ExitCode.USAGE] * 2, nodes[1].output_tail()
    line = smartlaunch_lines(nodes[1])
    assert len(line) == 1 and re.fullmatch(
        rf"smartlaunch: error: {c.hostnames[0]}, which decides for this job \(it hosts the "
        rf"rendezvous store at {re.escape(c.endpoint)} \(rdzv id job-{c.tag}\)\), stopped with "
        rf"exit 2: --nproc-per-node 3 exceeds the 2 GPUs visible .*", line[0]), line
    assert c.left_running() == []


def test_a_node_that_cannot_reach_the_deciding_node_ends_at_the_join_timeout(cluster):
    c = cluster(2)
    node = c.launch(1, "--nproc-per-node", "1", join_timeout=3)
    assert node.wait(START_S) == ExitCode.RENDEZVOUS, node.output_tail()
    lines = smartlaunch_lines(node)
    assert len(lines) == 1 and "Traceback" not in node.output, node.output
    assert lines[0] == (f"smartlaunch: error: cannot reach the rendezvous store at "
                        f"{c.endpoint} (rdzv id job-{c.tag}) within join_timeout=3 s: the node "
                        f"it names decides for the job; start smartlaunch there, and check that "
                        f"its port is reachable from this node"), lines[0]
    assert c.left_running() == []


@pytest.mark.parametrize("n", [2, 3])
def test_one_job_across_the_nodes(cluster, n):
    c = cluster(n)
    nodes = [c.launch(k, "--nproc-per-node", "1") for k in range(n)]
    codes = [node.wait(START_S) for node in nodes]
    assert codes == [0] * n, "\n---\n".join(node.output_tail() for node in nodes)
    seen = ranks_seen(nodes)
    assert sorted(seen) == list(range(n)) and {w for w, _ in seen.values()} == {n}, seen
    assert sorted(k for _, k in seen.values()) == list(range(n))   # one rank on every node
    for node in nodes:
        first = smartlaunch_lines(node)[0]
        assert "per node, nnodes" in first and "launched as torchrun would" in first, first
    assert c.left_running() == []


def test_two_ranks_per_node_on_the_cpu(cluster):
    c = cluster(2)
    nodes = [c.launch(k, "--nproc-per-node", "2") for k in range(2)]
    assert [node.wait(START_S) for node in nodes] == [0, 0], nodes[0].output_tail()
    seen = ranks_seen(nodes)
    assert sorted(seen) == [0, 1, 2, 3] and {w for w, _ in seen.values()} == {4}, seen
    assert sorted(k for _, k in seen.values()) == [0, 0, 1, 1]
    assert c.left_running() == []


def test_a_rank_failing_on_one_node_ends_the_job_on_every_node(cluster):
    c = cluster(2)
    nodes = [c.launch(k, "--nproc-per-node", "1", job=("fail", "1")) for k in range(2)]
    codes = [node.wait(START_S) for node in nodes]
    assert all(code != 0 for code in codes), codes
    failing = nodes[1]
    assert codes[1] == ExitCode.WORKER_FAILED, failing.output_tail()
    # Root cause first: the launcher's first line after the job names the failed rank on
    # this node, and the rank's own error follows in its log tail. (Exit code 1, or SIGABRT
    # where gloo's threads abort the interpreter's exit after the peer closed its sockets.)
    after = smartlaunch_lines(failing)[1:]
    assert re.search(rf"rank \d \(local 0, pid \d+\) on {c.hostnames[1]} failed with "
                     r"(exit code 1|signal SIGABRT)", after[0]), failing.output
    tail = failing.output[failing.output.index(after[0]):]
    assert "RuntimeError: deliberate failure of rank" in tail, failing.output
    # The other node's rank died of the lost peer; its launcher says where to look.
    assert "the job may have ended on another node first" in nodes[0].output, nodes[0].output
    assert c.left_running() == []


def test_sigterm_to_one_launcher_ends_the_job_on_every_node(cluster):
    c = cluster(2)
    nodes = [c.launch(k, "--nproc-per-node", "1", job=("wait",)) for k in range(2)]
    for node in nodes:
        node.wait_line(r"job: rank \d world 2", START_S)
    nodes[0].proc.send_signal(signal.SIGTERM)     # the node that hosts the c10d store
    assert nodes[0].wait(END_S) == 128 + signal.SIGTERM, nodes[0].output_tail()
    assert nodes[1].wait(END_S) != 0, nodes[1].output_tail()
    assert "got SIGTERM: forwarded to all ranks" in nodes[0].output
    if "failed with" in nodes[1].output:       # its rank saw the peer go (else: the store)
        assert "the job may have ended on another node first" in nodes[1].output
    assert c.left_running() == []


def test_a_node_that_never_joins_ends_the_launch_at_the_join_timeout(cluster):
    c = cluster(2)
    node = c.launch(0, "--nproc-per-node", "1", join_timeout=4)
    assert node.wait(START_S) == ExitCode.RENDEZVOUS == 11, node.output_tail()
    lines = smartlaunch_lines(node)
    assert len(lines) == 2 and "Traceback" not in node.output, node.output
    assert re.search(rf"rendezvous timed out: fewer than 2 nodes \(nnodes 2\) joined "
                     rf"{re.escape(c.endpoint)} \(rdzv id job-{c.tag}\) within join_timeout=4 s; "
                     r"start smartlaunch on every node", lines[1]), lines[1]
    assert c.left_running() == []



def train(step_s: float, grad_bytes: int, steps: int = 30) -> tuple[str, ...]:
    return (str(step_s), str(grad_bytes), str(steps))


@pytest.mark.slow
@pytest.mark.parametrize("rate,nodes", [(None, 2), ("10mbit", 1)])
def test_how_many_nodes_follows_the_measured_link_between_them(cluster, rate, nodes):
    # GPU nodes (a fixture; the dry run and the benchmarks then run on the CPU, gloo) with a
    # job of 50 ms steps and 256 KiB of gradients. Unshaped, the all-reduce between nodes
    # costs a few ms: both nodes. At 10 Mbit/s it costs ~0.2 s a step: one node runs the
    # job, the other ends with exit 0 and one line saying why.
    c = cluster(2)
    if rate:
        c.shape(rate)
    nodes_ = [c.launch(k, "--explain=json", "--nproc-per-node", "1", script=c.train,
                       job=train(0.05, 256 << 10), env=fake("pcie-phb-4070ti-pair"))
              for k in range(2)]
    codes = [node.wait(START_S * 2) for node in nodes_]
    assert codes == [0, 0], "\n---\n".join(node.output_tail() for node in nodes_)
    plan = printed_plan(nodes_[0])
    assert plan["nnodes"] == str(nodes), plan["reasons"]
    rule = "multi-node: the all-reduce between nodes, measured"
    why, *kept = [r for r in plan["reasons"] if r["rule"] == rule]
    assert re.search(r"between nodes measured at [\d.,]+ MB, gloo\)", why["text"]), why
    if nodes == 2:
        assert why["text"].startswith("all 2 nodes: DDP×2 predicted "), why
        assert printed_plan(nodes_[1])["nnodes"] == "2"
    else:
        assert why["text"].startswith("1 of the 2 nodes: one process predicted "), why
        assert [k["text"] for k in kept] == ["on the one node kept, the job is decided as a "
                                             "one-node job (as with --nnodes 1): single GPU on "
                                             "GPU0"]
        lines = smartlaunch_lines(nodes_[1])
        assert len(lines) == 1 and lines[0].startswith(
            f"smartlaunch: this node is not used: the job runs on 1 of its 2 nodes (decided "
            f"on {c.hostnames[0]}): 1 of the 2 nodes: "), lines
        assert "{" not in nodes_[1].output
    assert c.left_running() == []


@pytest.mark.slow
def test_the_one_node_kept_runs_what_a_one_node_job_would(cluster):
    # Two GPUs a node (a fixture), short steps and 32 MiB of gradients over gloo on a link of
    # 50 Mbit/s: one node is kept, and on it DDP×2 (torchrun's local DDP) loses to one GPU, so
    # the kept node runs what `--nnodes 1` would decide: a single GPU, launched for real.
    c = cluster(2)
    c.shape("50mbit")
    nodes_ = [c.launch(k, "--nproc-per-node", "2", script=c.train,
                       job=train(0.005, 32 << 20), env=fake("pcie-phb-4070ti-pair"))
              for k in range(2)]
    codes = [node.wait(START_S * 3) for node in nodes_]
    assert codes == [0, 0], "\n---\n".join(node.output_tail() for node in nodes_)
    assert re.search(r"train: world 1 samples/s", nodes_[0].output), nodes_[0].output_tail()
    lines = smartlaunch_lines(nodes_[1])
    assert len(lines) == 1 and "this node is not used" in lines[0], lines
    assert "train:" not in nodes_[1].output
    assert c.left_running() == []


@pytest.mark.slow
def test_the_deciding_node_killed_while_deciding_ends_the_others_and_leaves_nothing(cluster):
    # Node 0 dry-runs the job (it looks like a GPU node); SIGKILL it while the dry run runs:
    # node 1, waiting for the plan, ends with one line and exit 11, and no process of either
    # node outlives them (the dry run's guard kills it with its launcher).
    from helpers_common import wait_until
    c = cluster(2)
    probe = c.arrival_probe()
    other = c.launch(1, "--nproc-per-node", "1", script=c.train, job=train(0.05, 256 << 10, 400),
                     env=fake("pcie-phb-4070ti-pair"))
    decider = c.launch(0, "--nproc-per-node", "1", script=c.train,
                       job=train(0.05, 256 << 10, 400), env=fake("pcie-phb-4070ti-pair"))
    wait_until(lambda: [p for p in c.job_processes() if "smartlaunch.cli" not in p.cmdline()],
               START_S, "the deciding node's dry run")
    # ... once node 1 has joined the store, by the store's own count (else it waits for it up
    # to the join timeout; a connection alone may still be in c10d's handshake).
    wait_until(lambda: probe.poll() is not None, START_S, "the probe of node 1 on the store")
    assert probe.returncode == 0, "node 1 never joined the store"
    decider.kill()
    assert other.wait(END_S) == ExitCode.RENDEZVOUS, other.output_tail()
    lines = smartlaunch_lines(other)
    assert len(lines) == 1 and "Traceback" not in other.output, other.output
    assert lines[0] == (f"smartlaunch: error: lost the rendezvous store at {c.endpoint} (rdzv "
                        f"id job-{c.tag}) before the plan came: the node that decides for the "
                        f"job ended (its own output says why)"), lines[0]
    assert c.left_running() == []
