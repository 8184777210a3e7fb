"""What a node reads from the multi-node rendezvous store (unauthenticated: anyone who reaches
its port may write our keys; docs/trust-model.md) is data it checks, never code or environment.

Fast rows: the plan message, the plan and the all-reduce offer, hostile and honest, through
the very functions a follower runs (pipeline_nodes._message, _check_plan, _command_differs,
internode.read_offer, _offer_env). Process rows: a real follower (smartlaunch, --rdzv-conf
is_host=0) against a store this test hosts, with no deciding node: the test writes the keys a
hostile client would, so what the follower reads is exactly what the test wrote."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from helpers_common import fixture_path, wait_until
from helpers_decide import (TEST_MODEL, FakeComm, nv_pair, pcie4, policy, profile,
                            request)
from helpers_decide import decide as _decide
from smartlaunch.decide.plan import EnvVar, Plan
from smartlaunch.decide.prepare import prepare
from smartlaunch.errors import ExitCode, RendezvousError, SmartlaunchError, WireError
from smartlaunch.pipeline_nodes import (Endpoint, _check_plan, _command_differs, _message,
                                        _offer_env)
from smartlaunch.profile import internode
from smartlaunch.strategies import REGISTRY
from smartlaunch.topology.api import cpu_only

decide = functools.partial(_decide, model=TEST_MODEL, units=REGISTRY)
EP = Endpoint("127.0.0.1", 29400, "job", {}, 2, 2, 60.0)
WHERE = "127.0.0.1:29400 (rdzv id job)"


def published(plan: Plan, host: str = "node0") -> bytes:
    """The message the deciding node publishes (pipeline_nodes._publish)."""
    return json.dumps({"host": host, "plan": plan.to_dict()}, default=str).encode()


def ddp_plan():
    """A DDP×2 decision on an NV pair for a two-node job, prepared as the deciding node's is."""
    topo, pol = nv_pair(), policy()
    plan = decide(request(), topo, pol, profile(params=163_000_000, step_ms=21),
                  comm_for=FakeComm(topo))
    plan = prepare(plan, topo, pol, {}, units=REGISTRY, numactl="")
    return dataclasses.replace(plan, nnodes="2"), topo, pol, request(nnodes="2")


def honest_plans():
    yield ddp_plan()
    topo, pol = pcie4(), policy()
    sweep = request(variants=(("a",), ("b",)), nnodes="2")
    packed = decide(dataclasses.replace(sweep, nnodes="1"), topo, pol,
                    profile(params=6_900_000, step_ms=30), comm_for=FakeComm(topo))
    packed = prepare(packed, topo, pol, {}, units=REGISTRY, numactl="")
    yield dataclasses.replace(packed, nnodes="2", node_variants=((0,), (1,))), topo, pol, sweep
    cpu = cpu_only("no NVML")
    plan = decide(request(max_gpus=2), cpu, pol, None, comm_for=lambda g: None)
    yield dataclasses.replace(plan, nnodes="2"), cpu, pol, request(max_gpus=2, nnodes="2")


def read(raw: bytes, topo, pol, req) -> Plan:
    """What a follower takes from the message: _message, then _check_plan."""
    host, plan = _message(raw, EP)
    _check_plan(plan, EP, req, topo, pol)
    return plan


@pytest.mark.parametrize("case", range(3))
def test_honest_plans_read_back_whole(clean_env, case):
    plan, topo, pol, req = list(honest_plans())[case]
    assert read(published(plan), topo, pol, req) == plan
    assert _command_differs(plan, req, "node0") == ""


def _set(path: str, value):
    """A change to the plan's JSON at `path` ("reasons.0.text"); value may be a function of
    the old value; DELETE removes the key."""
    def apply(d: dict) -> dict:
        *head, last = path.split(".")
        node = d
        for k in head:
            node = node[int(k)] if isinstance(node, list) else node[k]
        key = int(last) if isinstance(node, list) else last
        if value is DELETE:
            del node[key]
        else:
            node[key] = value(node[key]) if callable(value) else value
        return d
    return apply


DELETE = object()
HOSTILE = {     # id: (change to the honest DDP plan's JSON, field named in the one line)
    "strategy-type": (_set("strategy", 3), "plan.strategy: 3, not a string"),
    "unknown-strategy": (_set("strategy", "rootkit"), "plan.strategy: 'rootkit' is not one of"),
    "missing-field": (_set("gpus", DELETE), "plan.gpus: missing"),
    "extra-key": (_set("ld_preload", "/tmp/x.so"), "plan.ld_preload: not a field of Plan"),
    "extra-env-key": (_set("env", [{"name": "A", "value": "b", "source": "c", "export": 1}]),
                      "plan.env[0].export: not a field of EnvVar"),
    "gpu-out-of-range": (_set("gpus", [0, 7]), "plan.gpus: GPU 7 is not one of this node's (0, 1)"),
    "gpu-negative": (_set("gpus", [-1]), "plan.gpus[0]: -1 is outside 0..1023"),
    "gpu-list-huge": (_set("gpus", list(range(100_000))), "plan.gpus: a list of 100000 items"),
    "candidate-gpu": (_set("candidates.0.gpus", [0, 9]),
                      "plan.candidates[0].gpus: GPU 9 is not one of this node's"),
    "nan": (_set("wait_timeout_s", float("nan")), "plan.wait_timeout_s: nan, not a finite"),
    "infinity": (_set("uncertainty_band", float("inf")), "plan.uncertainty_band: inf, not a"),
    "bool-for-int": (_set("nproc_per_node", True), "plan.nproc_per_node: true, not an integer"),
    "nproc-zero": (_set("nproc_per_node", 0), "plan.nproc_per_node: 0 is outside 1..65536"),
    "nproc-too-many": (_set("nproc_per_node", 64), "plan.nproc_per_node: 64, more than this"),
    "huge-int": (_set("requested_max", 10 ** 40), "plan.requested_max: an integer of 41 digits"),
    "long-reason": (_set("reasons.0.text", "x" * (1 << 20)),
                    "plan.reasons[0].text: a string of 1048576 characters, more than 16384"),
    "nnodes-shell": (_set("nnodes", "2; touch /tmp/x"), "plan.nnodes: '2; touch /tmp/x' is "
                     "neither this node's --nnodes (2) nor a count of its nodes"),
    "link-class": (_set("link_class", "NV99"), "plan.link_class: 'NV99' is not a link class"),
    "jobs-per-gpu": (_set("jobs_per_gpu", {"0": 99}), "plan.jobs_per_gpu: 99 jobs on a GPU"),
    "jobs-key": (_set("jobs_per_gpu", {"x": 1}), "plan.jobs_per_gpu key: not a GPU index"),
    "profile-status": (_set("profile.status", "pwned"), "plan.profile.status: 'pwned' is not"),
    "comm-points": (_set("comm.points", [["a", 1.0]]), "plan.comm.points[0][0]: a string, not"),
    "env-not-list": (_set("env", "PYTHONPATH=/tmp"), "plan.env: a string, not a list"),
    "numa-cpus": (_set("numa.0.cpus", "all"), "plan.numa[0].cpus: a string, not a list"),
    "topology-value": (_set("topology.hostname", ["x"]), "plan.topology.hostname: a list"),
    "group-variant": (_set("groups", [{"variant": 5, "strategy": "ddp", "gpus": [0],
                                       "link_class": None, "speedup": None, "basis": "x"}]),
                      "plan.groups[0].variant: 5, not the index of one of the plan's 0"),
    "node-share": (_set("node_variants", [[0], [3]]), "plan.node_variants[0]: names a variant"),
    "schema": (_set("schema_version", 2), "plan.schema_version: 2 is outside 1..1"),
}


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_a_hostile_plan_is_one_line_and_exit_11(clean_env, case):
    change, named = HOSTILE[case]
    plan, topo, pol, req = ddp_plan()
    d = change(json.loads(published(plan))["plan"])
    raw = json.dumps({"host": "node0", "plan": d}).encode()
    with pytest.raises(RendezvousError) as err:     # NaN and Infinity as Python writes them
        read(raw, topo, pol, req)
    text = str(err.value)
    assert err.value.exit_code == ExitCode.RENDEZVOUS == 11
    assert text.startswith(f"the plan on the rendezvous store at {WHERE} is malformed (field "
                           f"{named}"), text
    assert "\n" not in text and len(text) < 600, text
    assert "let only the job's nodes reach port 29400" in text


TEN_MB = json.dumps({"host": "x", "plan": {"note": "x" * (10 << 20)}}).encode()
RAW = {     # id: (the whole message, what the one line says it is)
    "ten-megabytes": (TEN_MB, f"malformed ({len(TEN_MB)} bytes, more than the 8388608 it may "
                              f"be)"),
    "not-utf8": (b'{"host": "\xff"}', "malformed (not UTF-8 text)"),
    "not-json": (b"{plan", "malformed (not JSON (Expecting property name"),
    "nested": (b"[" * 200_000 + b"]" * 200_000, "malformed (JSON nested too deep)"),
    "a-list": (b"[1, 2]", "malformed (field message: a list, not an object)"),
    "no-plan": (b'{"host": "x", "env": {"PYTHONPATH": "/tmp"}}',
                "malformed (field message: not {host, plan} nor {host, error, code})"),
    "plan-null": (b'{"host": "x", "plan": null}', "malformed (field plan: null, not an object)"),
    "host-type": (b'{"host": 7, "plan": {}}', "malformed (field message.host: 7, not a string)"),
}


@pytest.mark.parametrize("case", list(RAW), ids=list(RAW))
def test_a_message_that_is_no_plan_is_one_line_and_exit_11(case):
    raw, says = RAW[case]
    with pytest.raises(RendezvousError) as err:
        _message(raw, EP)
    assert err.value.exit_code == 11
    assert str(err.value).startswith(f"the plan on the rendezvous store at {WHERE} is {says}"), \
        str(err.value)[:300]
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("code,exit_code", [(2, 2), (12, 12), ("2", 11), (2.0, 11), (True, 11),
                                            (0, 11), (99, 11), (-9, 11), (None, 11)])
def test_a_published_error_keeps_only_a_documented_code(code, exit_code):
    raw = json.dumps({"host": "node0", "error": "--nproc-per-node 3 exceeds", "code": code})
    with pytest.raises(SmartlaunchError) as err:
        _message(raw.encode(), EP)
    assert err.value.exit_code == exit_code
    assert str(err.value) == (f"node0, which decides for this job (it hosts the rendezvous "
                              f"store at {WHERE}), stopped with exit {exit_code}: --nproc-per-"
                              f"node 3 exceeds")


def test_a_published_error_is_shown_bounded_on_one_line_without_escapes():
    raw = json.dumps({"host": "\x1b]0;owned\x07node0" + "h" * 1000,
                      "error": "bad\n\x1b[2J\rsmartlaunch: fake line" + "e" * 5000, "code": 2})
    with pytest.raises(SmartlaunchError) as err:
        _message(raw.encode(), EP)
    text = str(err.value)
    assert not any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 for c in text), repr(text[:200])
    host, _, rest = text.partition(", which decides")
    assert len(host) == 300 and host.endswith("…") and host.startswith(" ]0;owned node0")
    error = rest.partition("stopped with exit 2: ")[2]
    assert len(error) == 2000 and error.startswith("bad  [2J smartlaunch: fake line")


def test_a_plan_made_for_another_command_is_refused_naming_both():
    plan, topo, pol, req = ddp_plan()
    theirs = dataclasses.replace(plan, command=("/tmp/payload.py", "--x" * 60))
    why = _command_differs(read(published(theirs), topo, pol, req), req, "node0")
    assert why.startswith("this node's command (train.py) differs from the one the job's plan "
                          "was made for on node0 (/tmp/payload.py --x--x"), why
    assert why.endswith("…); start smartlaunch with the same script and arguments on every "
                        "node"), why


def test_a_sweep_with_other_variants_is_refused():
    _, (plan, topo, pol, req), _ = honest_plans()
    theirs = dataclasses.replace(plan, variants=(("a",), ("--data", "/etc/shadow")))
    why = _command_differs(read(published(theirs), topo, pol, req), req, "node0")
    assert why == ("this node's sweep (2 variants) differs from the one the job's plan was "
                   "made for on node0 (2 variants), first at variant 1; give every node the "
                   "same --each/--each-file")


# ---- the all-reduce offer --------------------------------------------------------------------
def offer_json(**change) -> bytes:
    good = {"port": 29511, "nodes": 2, "device": "cuda", "sizes": [256 << 10, 512 << 10],
            "strategy": "ddp", "gpus": [0, 1], "link_class": "NV18"}
    return json.dumps({**good, **change}).encode()


def read_offer(raw: bytes, topo=None):
    topo = topo or nv_pair()
    return internode.read_offer(raw, nodes=2, gpus=[g.index for g in topo.gpus],
                                links={lk.link_class for lk in topo.links},
                                strategies=tuple(REGISTRY))


def test_an_honest_offer_reads_back():
    assert read_offer(offer_json()) == internode.Offer(29511, 2, "cuda", (256 << 10, 512 << 10),
                                                       "ddp", (0, 1), "NV18")


OFFERS = {
    "the-old-env": (json.loads(offer_json()) | {"env": {"PYTHONPATH": "/tmp"}, "addr": "1.2.3.4"},
                    "offer.addr: not a field of Offer"),
    "env": ({"env": {"PYTHONPATH": "/tmp"}}, "offer.env: not a field of Offer"),
    "nodes": ({"nodes": 3}, "offer.nodes: 3 is outside 2..2"),
    "port-zero": ({"port": 0}, "offer.port: 0 is outside 1..65535"),
    "port-text": ({"port": "22"}, "offer.port: a string, not an integer"),
    "device": ({"device": "/dev/sda"}, "offer.device: '/dev/sda' is not one of cpu, cuda"),
    "not-pow2": ({"sizes": [300_000, 600_000]}, "offer.sizes: not two or more increasing"),
    "too-big": ({"sizes": [256 << 10, 1 << 30]}, "offer.sizes[1]: 1073741824 is outside"),
    "too-many": ({"sizes": [256 << 10] * 40}, "offer.sizes: a list of 40 items, more than 16"),
    "gloo-cap": ({"device": "cpu", "sizes": [256 << 10, 256 << 20]},
                 "offer.sizes: 268435456 bytes, more than 33554432 on the cpu"),
    "gpu": ({"gpus": [5]}, "offer.gpus: [5] is not a list of this node's GPUs (0, 1)"),
    "no-gpu": ({"gpus": []}, "offer.gpus: none, for a measurement on the GPU"),
    "link": ({"link_class": "NV99"}, "offer.link_class: 'NV99' is not one of NV18"),
    "strategy": ({"strategy": "sh"}, "offer.strategy: 'sh' is not one of"),
}


@pytest.mark.parametrize("case", list(OFFERS), ids=list(OFFERS))
def test_a_hostile_offer_is_refused_naming_the_field(case):
    change, named = OFFERS[case]
    raw = json.dumps(change).encode() if case == "the-old-env" else offer_json(**change)
    with pytest.raises(WireError) as err:
        read_offer(raw)
    assert str(err.value).startswith(f"field {named}"), str(err.value)


def test_an_offer_over_its_cap_or_not_json_is_refused():
    with pytest.raises(WireError, match="more than the 65536"):
        read_offer(offer_json(strategy="x" * 100_000))
    with pytest.raises(WireError, match="not JSON"):
        read_offer(b"{offer")
    with pytest.raises(WireError, match="field offer: nan, not an object"):
        read_offer(b"NaN")


def test_the_measuring_rank_gets_this_nodes_environment_for_the_offered_decision(clean_env):
    # What prepare() gives the same decision here: this node's policy and environment; the
    # offer names no variable. The DDP plan's own env on this node is the reference.
    plan, topo, pol, _ = ddp_plan()
    offer = read_offer(offer_json())
    environ = {"NCCL_DEBUG": "WARN"}
    want = prepare(plan, topo, pol, environ, units=REGISTRY, numactl="").env_dict()
    assert _offer_env(offer, topo, pol, environ) == want
    assert "PYTHONPATH" not in want


# ---- a real follower against a store the test hosts ------------------------------------------
VARIANT = """\
import json, os, sys
out = sys.argv[1]
with open(os.path.join(out, f"variant-{os.environ['SMARTLAUNCH_JOB_INDEX']}.json"), "x") as f:
    json.dump({"args": sys.argv[2:], "pythonpath": os.environ.get("PYTHONPATH", "")}, f)
"""
SITECUSTOMIZE = """\
import os
here = os.path.dirname(os.path.abspath(__file__))
open(os.path.join(here, "MARKER"), "w").write(str(os.getpid()))
"""
GPUS = "pcie-phb-4070ti-pair"


class Follower:
    """smartlaunch as a node that does not host the store, against a TCPStore this test hosts
    on 127.0.0.1 (no deciding node): `keys` writes what a hostile client would."""

    def __init__(self, root: Path, *options: str, nnodes: int = 2):
        from torch.distributed import PrefixStore, TCPStore

        from helpers_multinode import Node
        from smartlaunch.worker_env import free_port
        self.root, self.port, self.run_id = root, free_port(), "trust"
        self.store = TCPStore("127.0.0.1", self.port, is_master=True, multi_tenant=True,
                              wait_for_workers=False, timeout=timedelta(seconds=60))
        self.evil = root / "evil"
        self.evil.mkdir()
        (self.evil / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.script, self.out = root / "variant.py", root / "out"
        self.script.write_text(VARIANT)
        self.out.mkdir()
        home = root / "home"
        (home / "cache").mkdir(parents=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PET_", "SLURM_", "SMARTLAUNCH_", "TORCHELASTIC_", "NCCL_"))}
        env.update(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"),
                   SMARTLAUNCH_LEASE_DIR=str(root / "leases"),
                   SMARTLAUNCH_FAKE_TOPOLOGY=fixture_path(GPUS))
        self.argv = [sys.executable, "-m", "smartlaunch.cli", "--nnodes", str(nnodes),
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.port}",
                     "--rdzv-id", self.run_id, "--rdzv-conf", "is_host=0,join_timeout=60",
                     *options, str(self.script), str(self.out)]
        self.node = Node(1, self.argv, env, root)
        # A plain client, under our keys' prefix as pipeline_nodes._prefixed names them.
        self.hostile = PrefixStore(f"smartlaunch/{self.run_id}/", TCPStore(
            "127.0.0.1", self.port, is_master=False, timeout=timedelta(seconds=60)))

    def arrived(self) -> None:
        wait_until(lambda: self.hostile.add("arrived", 0) >= 1 or self.node.proc.poll(), 120,
                   "the follower on the store")
        assert self.node.proc.poll() is None, self.node.output_tail()

    def write(self, name: str, value) -> None:
        self.hostile.set(name, json.dumps(value, default=str))

    def marker(self) -> bool:
        return (self.evil / "MARKER").exists()

    def close(self) -> None:
        self.node.kill()


@pytest.fixture
def follower(tmp_path):
    made = []

    def make(*options: str, **kw) -> Follower:
        made.append(Follower(tmp_path, *options, **kw))
        return made[-1]
    yield make
    for f in made:
        f.close()


def sweep_plan(f: Follower, **change) -> Plan:
    """The plan a deciding node would publish for the follower's own sweep of two variants
    over two nodes, on the fixture's hardware."""
    from smartlaunch.topology import discover
    topo = discover({"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path(GPUS)})
    variants = (("--lr", "1"), ("--lr", "2"))
    return Plan(strategy="independent", device="cuda", gpus=(0, 1), nproc_per_node=1,
                requested_max=2, variants=variants, nnodes="2", node_variants=((0,), (1,)),
                command=(str(f.script), str(f.out)),
                topology={"hostname": "node0", "hardware": topo.hardware(),
                          "hardware_fingerprint": topo.hardware_fingerprint()}, **change)


SWEEP = ("--each", "--lr 1", "--each", "--lr 2")


def test_a_hostile_writer_names_pythonpath_and_nothing_of_it_runs(follower):
    # The attack the store allowed: an offer with PYTHONPATH for the measuring rank, then a
    # plan whose workers get it. The offer is ignored with one line; the plan runs this node's
    # share with this node's own environment; no process of ours imports sitecustomize.py.
    f = follower(*SWEEP)
    f.arrived()
    f.write("internode", {"addr": "127.0.0.1", "port": 29577, "nodes": 2, "device": "cpu",
                          "sizes": [262144, 524288], "gpu": None,
                          "env": {"PYTHONPATH": str(f.evil)}})
    f.node.wait_line(r"ignored the offer", 120)
    evil = (EnvVar("PYTHONPATH", str(f.evil), "the wire"),)
    f.write("plan", {"host": "node0", "plan": sweep_plan(f, env=evil).to_dict()})
    assert f.node.wait(120) == 0, f.node.output_tail()
    lines = [x for x in f.node.lines if x.startswith("smartlaunch: ")]
    assert lines[0] == (f"smartlaunch: ignored the offer to measure the all-reduce between "
                        f"nodes on the rendezvous store at 127.0.0.1:{f.port} (rdzv id trust): "
                        f"it is malformed (field offer.addr: not a field of Offer); waiting for "
                        f"the plan"), lines
    ran = [json.loads(p.read_text()) for p in sorted(f.out.glob("variant-*.json"))]
    assert [r["args"] for r in ran] == [["--lr", "2"]], ran        # node 1's share
    assert str(f.evil) not in ran[0]["pythonpath"]
    assert not f.marker() and "Traceback" not in f.node.output


@pytest.mark.parametrize("what", ["malformed", "command"])
def test_a_plan_this_node_cannot_take_ends_it_with_one_line(follower, what):
    f = follower("--nproc-per-node", "1")
    f.arrived()
    # A 4 MB string in an otherwise honest message (torch's store takes at most 8 MiB).
    if what == "malformed":
        plan = sweep_plan(f, env=(EnvVar("PYTHONPATH", str(f.evil), "x" * (4 << 20)),))
        want, code = (f"smartlaunch: error: the plan on the rendezvous store at 127.0.0.1:"
                      f"{f.port} (rdzv id trust) is malformed (field plan.env[0].source: a "
                      f"string of 4194304 characters, more than 16384); nothing was started "
                      f"here"), ExitCode.RENDEZVOUS
    else:                       # the honest plan of another command, with its environment
        plan = dataclasses.replace(sweep_plan(f, env=(EnvVar("PYTHONPATH", str(f.evil), "x"),)),
                                   command=(str(f.evil / "sitecustomize.py"),), variants=(),
                                   node_variants=(), strategy="ddp", nproc_per_node=1)
        want, code = "smartlaunch: error: this node's command (", ExitCode.NODE_MISMATCH
    f.write("plan", {"host": "node0", "plan": plan.to_dict()})
    assert f.node.wait(120) == code, f.node.output_tail()
    lines = [x for x in f.node.lines if x.startswith("smartlaunch: ")]
    assert len(lines) == 1 and lines[0].startswith(want), lines
    if what == "command":       # both named, each cut to 80 characters
        m = re.fullmatch(r"smartlaunch: error: this node's command \((.+)\) differs from the one "
                         r"the job's plan was made for on node0 \((.+)\); start smartlaunch with "
                         r"the same script and arguments on every node(; the rendezvous was "
                         r"closed, so the other nodes end too)?", lines[0])
        assert m, lines[0]
        for shown, real in ((m[1], f"{f.script} {f.out}"), (m[2], str(plan.command[0]))):
            assert len(shown) <= 80 and real.startswith(shown.rstrip("…")), (shown, real)
    assert "Traceback" not in f.node.output and not f.marker()
    assert list(f.out.iterdir()) == []


def _paths(node, prefix=()):
    """Every key path of a JSON value, containers and leaves."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for k, v in items:
        yield from _paths(v, prefix + (k,))


@pytest.mark.parametrize("case", range(3))
def test_any_value_of_any_type_anywhere_is_a_wire_error_or_a_plan(clean_env, case):
    # Every field of an honest plan, at every depth, replaced by each JSON type: the reader
    # returns a plan or raises the one-line RendezvousError, never anything else.
    plan, topo, pol, req = list(honest_plans())[case]
    honest = json.loads(published(plan))
    others = (None, True, -1, 10 ** 30, 1e308, "x\x1b", [], {}, [[]], {"a": 1})
    tried = 0
    for path in _paths(honest["plan"]):
        for other in others:
            d = json.loads(json.dumps(honest))
            if path:
                *head, last = path
                node = d["plan"]
                for k in head:
                    node = node[k]
                node[last] = other
            else:
                d["plan"] = other
            tried += 1
            try:
                read(json.dumps(d).encode(), topo, pol, req)
            except RendezvousError as exc:
                assert "\n" not in str(exc) and "\x1b" not in str(exc), (path, other)
    assert tried > 300
