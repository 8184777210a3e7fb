"""One decision for a multi-node job: the node that hosts the c10d rendezvous store (torch's
rule) decides and publishes the plan under `smartlaunch/<rdzv id>/` in that TCPStore (opened
multi-tenant, so torch's agent reuses it); every other node reads it. A node whose hardware
differs refuses it (NodeMismatchError). Other backends have no store: each node decides alone.
A sweep across nodes is split, each node running the share its arrival order names.

The store is unauthenticated: every node checks what it reads (typed, bounded, its own GPUs
and node count), and the command, variants, environment and NUMA bindings are never taken
from it: a node makes them from its own command line, policy, topology and environment.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any
from datetime import timedelta

from smartlaunch import wire
from smartlaunch.decide.api import NeedNodes
from smartlaunch.decide.nodes import RULE_NODES, sweep_across_nodes
from smartlaunch.decide.plan import Plan, Reason
from smartlaunch.decide.prepare import prepare
from smartlaunch.errors import (ExitCode, NodeMismatchError, NodeNotNeeded, RendezvousError,
                                SmartlaunchError, UsageError, WireError)
from smartlaunch.profile import internode
from smartlaunch.profile.comm import device_for
from smartlaunch.strategies import REGISTRY

KEY_PLAN = "plan"           # JSON: {"host", "plan"} or {"host", "error", "code"}
KEY_READ = "read"           # a counter: the nodes that have read it
KEY_ARRIVED = "arrived"     # a counter: the other nodes that have come (their rank between nodes)
POLL_S = 0.1                # between store checks: Ctrl-C is seen between two
CONNECT_TRY_S = 2           # one connection attempt (the whole wait is join_timeout)
STORE_OP_S = 10             # one store operation of a client: a lost server is noticed within
DEFAULT_PORT = 29400        # torch's c10d default
MAX_MESSAGE_BYTES = 8 << 20  # a plan: --each-file's 1 MiB of variants, quoted, and the rest
MAX_HOST, MAX_ERROR = 300, 2000     # the published host name and error, as shown
_SERVING: list = []         # the deciding node's store, kept until the process ends


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """The job's c10d rendezvous as torch's agent will see it."""
    host: str
    port: int
    run_id: str
    conf: dict
    min_nodes: int
    max_nodes: int
    join_timeout_s: float

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port} (rdzv id {self.run_id})"

    def hosts_store(self) -> bool:
        """torch's c10d rule (c10d_rendezvous_backend._create_tcp_store)."""
        from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname
        given = self.conf.get("is_host")
        if given is not None:
            return str(given).lower() in ("1", "true", "t", "yes", "y")
        return _matches_machine_hostname(self.host)


def endpoint_of(args) -> Endpoint | None:
    """The c10d rendezvous of torchrun's namespace; None for another backend."""
    if args is None or getattr(args, "standalone", False) or args.rdzv_backend != "c10d":
        return None
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout
    from torch.distributed.elastic.rendezvous.utils import (
        _parse_rendezvous_config, parse_rendezvous_endpoint)
    from torch.distributed.run import parse_min_max_nnodes
    host, port = parse_rendezvous_endpoint(args.rdzv_endpoint or "", default_port=DEFAULT_PORT)
    conf = _parse_rendezvous_config(args.rdzv_conf or "")
    lo, hi = parse_min_max_nnodes(str(args.nnodes))
    join = float(conf.get("join_timeout", RendezvousTimeout().join.total_seconds()))
    return Endpoint(host, port, str(args.rdzv_id), conf, lo, hi, join)


def one_decision(request, topology, policy, environ, decide: Callable[..., tuple],
                 status=None) -> tuple:
    """(plan, topology, policy) for this node of a multi-node job: `decide(request, reasons,
    nodes, between)`'s on the node that hosts the store, the published one elsewhere; a
    sweep's plan is this node's share."""
    sweep = sweep_across_nodes(request)
    args = request.torchrun_args
    ep = endpoint_of(args)
    backend = "--standalone" if getattr(args, "standalone", False) else \
        f"--rdzv-backend {args.rdzv_backend}"
    if sweep is not None and ep is None and backend != "--rdzv-backend static":
        raise UsageError(f"--each across nodes needs to know which share of the variants is "
                         f"this node's, and {backend} does not say: use "
                         f"--rdzv-backend c10d (the node hosting its store splits the sweep), "
                         f"or static with --node-rank")

    def decide_all(why: Reason, nodes: int = 0, between=None) -> tuple:
        if sweep is None:
            return decide(request, (why,), nodes, between)
        plan, topo, pol = decide(sweep.request, (why,))
        return sweep.plan(plan), topo, pol
    if ep is None:
        plan, topo, policy = decide_all(Reason(
            f"each node of this job decides alone: the {backend} rendezvous has no store "
            f"before the job starts (c10d has: there the rendezvous' node decides for all)"
            + (f"; this node runs the share of --node-rank {args.node_rank}"
               if sweep is not None else ""), f"user: {backend}"))
        return (_share(plan, args.node_rank, "this node") if sweep else plan), topo, policy
    store, hosting = _open(ep)
    me = socket.gethostname()
    if hosting:
        why = Reason(f"this node decides for every node of the job (it hosts the rendezvous "
                     f"store at {ep.where}); the others run this plan on hardware like this "
                     f"node's ({topology.hardware()})", "multi-node: one decision for the job")
        nodes = ep.max_nodes if ep.min_nodes == ep.max_nodes >= 2 and sweep is None else 0
        return _decide_for_all(store, ep, me, request, lambda: decide_all(
            why, nodes, functools.partial(_between, store, ep, topology, environ, status)),
            status)
    return _read_plan(store, ep, request, topology, policy, environ, status)


def _prefixed(store, ep: Endpoint):
    from torch.distributed import PrefixStore
    return PrefixStore(f"smartlaunch/{ep.run_id}/", store)


def _open(ep: Endpoint):
    """(store, hosting): the server where this node hosts the store (a port taken makes it a
    client, as in torch), else a client that waits up to join_timeout."""
    from torch.distributed import TCPStore
    timeout = timedelta(seconds=max(60.0, ep.join_timeout_s))
    if ep.hosts_store():
        try:
            server = TCPStore(ep.host, ep.port, is_master=True, multi_tenant=True,
                              wait_for_workers=False, timeout=timeout)
            return _prefixed(server, ep), True
        except (RuntimeError, ValueError, TimeoutError):
            if ep.conf.get("is_host") is not None:
                raise RendezvousError(f"cannot host the rendezvous store at {ep.where}: port "
                                      f"{ep.port} is taken on this node; free it or give "
                                      f"another port in --rdzv-endpoint") from None

    def connect():
        try:
            # A plain connection first: c10d logs every attempt that fails, we only wait.
            socket.create_connection((ep.host, ep.port), timeout=CONNECT_TRY_S).close()
            client = TCPStore(ep.host, ep.port, is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=CONNECT_TRY_S))
            client.set_timeout(timedelta(seconds=STORE_OP_S))
            return client
        except (OSError, RuntimeError, ValueError, TimeoutError):
            return None
    client = _poll(connect, ep.join_timeout_s)
    if client is None:
        raise RendezvousError(
            f"cannot reach the rendezvous store at {ep.where} within join_timeout="
            f"{ep.join_timeout_s:g} s: the node it names decides for the job; start "
            f"smartlaunch there, and check that its port is reachable from this node")
    return _prefixed(client, ep), False


def _poll(ready: Callable[[], Any], timeout_s: float | None = None) -> Any:
    """The first value other than None that ready() returns, called every POLL_S; None once
    timeout_s (if any) has passed."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        got = ready()
        if got is not None:
            return got
        if deadline is not None and time.monotonic() > deadline:
            return None
        time.sleep(POLL_S)


def _decide_for_all(store, ep: Endpoint, me: str, request, decide, status) -> tuple:
    try:
        plan, topo, policy = decide()
    except SmartlaunchError as exc:
        _publish(store, {"host": me, "error": str(exc), "code": int(exc.exit_code)})
        _serve(store, ep, status, "read why this node stopped")
        raise
    _publish(store, {"host": me, "plan": plan.to_dict()})
    if request.explain:         # nothing to launch: stay until the others have read it
        _serve(store, ep, status, "read the plan")
    elif plan.node_variants:    # a sweep: this store ends with its share, so after their reads
        read = _serve(store, ep, status, "take their share of the sweep")
        if read < ep.max_nodes - 1:
            raise RendezvousError(
                f"only {read} of the other {ep.max_nodes - 1} node(s) took their share of the "
                f"sweep at {ep.where} within join_timeout={ep.join_timeout_s:g} s, so the "
                f"others' variants would not run; none was started here (those that came run "
                f"theirs): start smartlaunch on every node (--nnodes {ep.max_nodes})")
    else:                       # the agent's rendezvous uses this server; late nodes read it
        _SERVING.append(store)
    return (_share(plan, 0, me) if plan.node_variants else plan), topo, policy


def _between(store, ep: Endpoint, topology, environ, status, need: NeedNodes):
    """NeedNodes fulfilled once every node has come: the leader curve, or why none."""
    n = need.nodes
    if status is not None:
        status.ticking(f"waiting for the other {n - 1} node(s) to measure the all-reduce "
                       f"between nodes (at most {ep.join_timeout_s:g} s)")
    if _poll(lambda: store.add(KEY_ARRIVED, 0) >= n - 1 or None, ep.join_timeout_s) is None:
        return (f"not every node arrived within join_timeout={ep.join_timeout_s:g} s to "
                f"measure the all-reduce between nodes")
    device = device_for(topology) if need.cuda else "cpu"   # a fake topology: gloo
    spec = internode.offer(store, nodes=n, device=device,
                           sizes=internode.sizes_for(need.grad_bytes, device),
                           strategy=need.strategy, gpus=need.gpus, link_class=need.link_class)
    if status is not None:
        status.ticking(f"measuring the all-reduce between the {n} nodes (one rank on each)")
    try:
        return internode.measure(spec, 0, {**environ, **dict(need.env)}, host=ep.host)
    except RuntimeError as exc:
        return f"the all-reduce between nodes could not be measured ({exc})"


def _publish(store, message: dict) -> None:
    store.set(KEY_PLAN, json.dumps(message, default=str))


def _serve(store, ep: Endpoint, status, what: str) -> int:
    """Wait until the other nodes (--nnodes' least) have read the plan, at most join_timeout;
    returns how many did."""
    want = ep.min_nodes - 1
    if status is not None and want > 0:
        status.ticking(f"waiting for the other {want} node(s) to {what} (at most "
                       f"{ep.join_timeout_s:g} s)")

    def all_read() -> int | None:
        read = store.add(KEY_READ, 0)
        return read if read >= want else None
    read = _poll(all_read, ep.join_timeout_s)
    return store.add(KEY_READ, 0) if read is None else read


def _read_plan(store, ep: Endpoint, request, topology, policy, environ, status) -> tuple:
    place = store.add(KEY_ARRIVED, 1)      # 1, 2, ...: this node's rank between nodes
    raw = _wait_plan(store, ep, place, lambda offer: _join_measurement(
        offer, place, ep, topology, policy, environ, status))
    store.add(KEY_READ, 1)
    host, plan = _message(raw, ep)
    theirs, mine = plan.topology.get("hardware_fingerprint"), topology.hardware_fingerprint()
    sweep = bool(plan.node_variants)    # no rendezvous of the job: the others run theirs
    if theirs != mine:
        raise _refused(
            f"this node ({socket.gethostname()}: {topology.hardware()}) differs from the node "
            f"the job's plan was made on ({host}: {wire.line(plan.topology.get('hardware'), 300)}"
            f"; hardware fingerprints {mine} and {wire.line(theirs, 32)}); run the job on nodes "
            f"with the same GPUs and links, or start it separately on each kind of node"
            + ("; the other nodes run their shares of the sweep, this node's variants do not "
               "run" if sweep else ""), ep, sweep)
    _check_plan(plan, ep, request, topology, policy)
    differs = _command_differs(plan, request, host)
    if differs:
        raise _refused(differs, ep, sweep)
    plan = dataclasses.replace(plan, command=request.worker_command(),
                               variants=tuple(request.variants),
                               wait_for_lease=not request.no_wait,
                               wait_timeout_s=policy.jobs.wait_timeout_s)
    if plan.node_variants:
        plan = _share(plan, place, host)
    used = int(plan.nnodes) if plan.nnodes.isdigit() else ep.max_nodes
    if place >= used and not plan.node_variants:
        why = next((r.text for r in plan.reasons if r.rule == RULE_NODES), "")
        raise NodeNotNeeded(f"this node is not used: the job runs on {used} of its "
                            f"{ep.max_nodes} nodes (decided on {host}): {wire.line(why, 1000)}")
    why = Reason(f"the plan {host} made for every node of the job (it hosts the rendezvous "
                 f"store at {ep.where}); this node's hardware is the same ({topology.hardware()})",
                 "multi-node: one decision for the job")
    plan = _prepared_here(dataclasses.replace(plan, reasons=plan.reasons + (why,)), topology,
                          policy, request, environ)
    return plan, topology, policy


def _refused(text: str, ep: Endpoint, sweep: bool) -> NodeMismatchError:
    """This node cannot run the plan; with a fixed node count the rendezvous is closed."""
    closed = _close_rendezvous(ep) if ep.min_nodes == ep.max_nodes and not sweep else False
    return NodeMismatchError(text + ("; the rendezvous was closed, so the other nodes end too"
                                     if closed else ""))


def _message(raw: bytes, ep: Endpoint) -> tuple[str, Plan]:
    """(the deciding node's name, its plan); its published error raised with its code;
    RendezvousError naming the field for anything malformed."""
    try:
        message = wire.obj(wire.loads(raw, MAX_MESSAGE_BYTES), "message", 4)
        host = wire.line(message.get("host"), MAX_HOST) or "?"
        if set(message) == {"host", "error", "code"}:
            code = message["code"]
            known = isinstance(code, int) and not isinstance(code, bool) and \
                code in set(ExitCode) - {ExitCode.OK}
            code = ExitCode(code) if known else ExitCode.RENDEZVOUS
            raise SmartlaunchError(f"{host}, which decides for this job (it hosts the "
                                   f"rendezvous store at {ep.where}), stopped with exit "
                                   f"{int(code)}: {wire.line(message['error'], MAX_ERROR)}",
                                   exit_code=code)
        if set(message) != {"host", "plan"}:
            raise WireError("message", "not {host, plan} nor {host, error, code}")
        wire.text(message["host"], "message.host", MAX_HOST)
        return host, Plan.from_dict(message["plan"], strategies=tuple(REGISTRY))
    except WireError as exc:
        raise _malformed(ep, exc) from None


def _malformed(ep: Endpoint, exc: WireError) -> RendezvousError:
    return RendezvousError(
        f"the plan on the rendezvous store at {ep.where} is malformed ({exc}); nothing was "
        f"started here: smartlaunch on the node it names publishes a well-formed one, so "
        f"another program or version wrote it; run the same smartlaunch on every node and "
        f"let only the job's nodes reach port {ep.port}")


def _check_plan(plan: Plan, ep: Endpoint, request, topology, policy) -> None:
    """The plan's values make sense on this node; RendezvousError naming the field otherwise."""
    try:
        _fits(plan, ep, request, topology, policy)
    except WireError as exc:
        raise _malformed(ep, exc) from None


def _fits(plan: Plan, ep: Endpoint, request, topology, policy) -> None:
    mine = {g.index for g in topology.gpus}
    links = {link.link_class for link in topology.links}

    def own(gpus, where: str) -> None:
        stray = sorted(set(gpus) - mine)
        if stray:
            raise WireError(where, f"GPU {stray[0]} is not one of this node's "
                            f"({', '.join(map(str, sorted(mine))) or 'none'})")
    if plan.device == "cuda" and not plan.gpus:
        raise WireError("plan.gpus", "none, for a plan on the GPU")
    if len(set(plan.gpus)) != len(plan.gpus):
        raise WireError("plan.gpus", "names a GPU twice")
    for name in ("gpus", "left_free", "fallback_gpus"):
        own(getattr(plan, name), f"plan.{name}")
    own(plan.jobs_per_gpu, "plan.jobs_per_gpu")
    for i, c in enumerate(plan.candidates):
        own(c.gpus, f"plan.candidates[{i}].gpus")
    for i, g in enumerate(plan.groups):
        own(g.gpus, f"plan.groups[{i}].gpus")
        if g.link_class is not None and g.link_class not in links:
            raise WireError(f"plan.groups[{i}].link_class", f"{g.link_class!r} is not a link "
                            f"class of this node")
    if plan.link_class is not None and plan.link_class not in links:
        raise WireError("plan.link_class", f"{plan.link_class!r} is not a link class of this "
                        f"node")
    # At most what this node's torchrun could start: a rank per GPU, or what it was told.
    most = min(len(mine), request.max_gpus or len(mine)) if plan.device == "cuda" else \
        request.max_gpus or os.cpu_count() or 1
    if plan.nproc_per_node > most:
        raise WireError("plan.nproc_per_node", f"{plan.nproc_per_node}, more than this node "
                        f"runs ({most})")
    over = [n for n in plan.jobs_per_gpu.values() if n > policy.jobs.jobs_per_gpu]
    if over:
        raise WireError("plan.jobs_per_gpu", f"{over[0]} jobs on a GPU, more than this node's "
                        f"policy allows (jobs.jobs_per_gpu={policy.jobs.jobs_per_gpu})")
    if plan.nnodes != request.nnodes and not (
            plan.nnodes.isascii() and plan.nnodes.isdigit() and len(plan.nnodes) <= 6
            and 1 <= int(plan.nnodes) <= ep.max_nodes):
        raise WireError("plan.nnodes", f"{plan.nnodes!r} is neither this node's --nnodes "
                        f"({request.nnodes}) nor a count of its nodes")
    if plan.node_variants and len(plan.node_variants) != ep.max_nodes:
        raise WireError("plan.node_variants", f"{len(plan.node_variants)} shares for "
                        f"{ep.max_nodes} nodes")


def _command_differs(plan: Plan, request, host: str) -> str:
    """Why the plan was made for another command line or sweep than this node's, or ""."""
    mine, theirs = request.worker_command(), plan.command
    if mine != theirs:
        return (f"this node's command ({_short(mine)}) differs from the one the job's plan "
                f"was made for on {host} ({_short(theirs)}); start smartlaunch with the same "
                f"script and arguments on every node")
    if tuple(request.variants) != plan.variants:
        k = next((i for i, (a, b) in enumerate(zip(request.variants, plan.variants)) if a != b),
                 min(len(request.variants), len(plan.variants)))
        return (f"this node's sweep ({len(request.variants)} variants) differs from the one the "
                f"job's plan was made for on {host} ({len(plan.variants)} variants), first at "
                f"variant {k}; give every node the same --each/--each-file")
    return ""


def _short(command) -> str:
    import shlex
    return wire.line(shlex.join(command), 80)


def _prepared_here(plan: Plan, topology, policy, request, environ) -> Plan:
    """The plan with the workers' environment and NUMA bindings made on this node."""
    bare = dataclasses.replace(plan, env=(), numa=(), groups=tuple(
        dataclasses.replace(g, env=(), numa=()) for g in plan.groups))
    made = prepare(bare, topology, policy, environ, units=REGISTRY,
                   torchrun_numa=getattr(request.torchrun_args, "numa_binding", None))
    return dataclasses.replace(made, reasons=tuple(dict.fromkeys(made.reasons)))


def _share(plan: Plan, k: int, host: str) -> Plan:
    """Node k's share of a sweep across nodes; NodeNotNeeded when it has none."""
    split = plan.node_variants
    if k < len(split) and split[k]:
        return plan.for_node(k)
    used = sum(1 for s in split if s)
    raise NodeNotNeeded(f"this node is not used: the sweep's {len(plan.variants)} variant(s) "
                        f"are split over {used} of its {len(split)} nodes, one share each "
                        f"(decided on {host}), and none is left for this node")


def _wait_plan(store, ep: Endpoint, place: int, join) -> bytes:
    """The published message; RendezvousError if the deciding node went away first.
    Meanwhile `join(raw)` runs once for an offered all-reduce between nodes."""
    offered = False

    def plan() -> bytes | None:
        nonlocal offered
        try:
            if store.check([KEY_PLAN]):
                return store.get(KEY_PLAN)
            if not offered and store.check([internode.KEY]):
                offered = True
                join(store.get(internode.KEY))
        except (RuntimeError, ValueError) as exc:   # torch's DistNetworkError: the node ended
            raise RendezvousError(
                f"lost the rendezvous store at {ep.where} before the plan came: the node that "
                f"decides for the job ended (its own output says why)") from exc
        return None
    return _poll(plan)


def _join_measurement(raw: bytes, place: int, ep: Endpoint, topology, policy, environ,
                      status) -> None:
    """This node's leader rank of the all-reduce between nodes, with its own environment and
    policy's variables; a malformed offer is ignored with one line."""
    try:
        offer = internode.read_offer(
            raw, nodes=ep.max_nodes, gpus=[g.index for g in topology.gpus],
            links={link.link_class for link in topology.links}, strategies=tuple(REGISTRY))
    except WireError as exc:
        _say(status, f"ignored the offer to measure the all-reduce between nodes on the "
                     f"rendezvous store at {ep.where}: it is malformed ({exc}); waiting for "
                     f"the plan")
        return
    env = {**environ, **_offer_env(offer, topology, policy, environ)}
    try:
        internode.measure(offer, place, env, host=ep.host)
    except RuntimeError:
        pass        # rank 0 fails too and says so in the plan


def _offer_env(offer, topology, policy, environ) -> dict[str, str]:
    """The variables prepare() gives the offered decision on this node."""
    decision = Plan(strategy=offer.strategy, device=offer.device, gpus=offer.gpus,
                    nproc_per_node=max(1, len(offer.gpus)),
                    requested_max=max(1, len(offer.gpus)), link_class=offer.link_class)
    return prepare(decision, topology, policy, environ, units=REGISTRY, numactl="").env_dict()


def _say(status, text: str) -> None:
    if status is not None:
        status.line(text)
    else:
        import sys
        print(f"smartlaunch: {text}", file=sys.stderr, flush=True)


def _close_rendezvous(ep: Endpoint) -> bool:
    """Close the job's torch rendezvous so the nodes waiting in it end; False if it could not."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    try:
        params = RendezvousParameters(backend="c10d", endpoint=f"{ep.host}:{ep.port}",
                                      run_id=ep.run_id, min_nodes=ep.min_nodes,
                                      max_nodes=ep.max_nodes, **ep.conf)
        handler = get_rendezvous_handler(params)
        handler.set_closed()
        handler.shutdown()
        return True
    except Exception:       # torch's rendezvous errors: the others then wait out join_timeout
        return False
