"""Several "nodes" on one host for the multi-node tests: each node is a network namespace with
its own address on a bridge, its own hostname (a UTS namespace) and hosts file naming every
node, and its own HOME, cache and lease directories. A launcher started on a node sees a
machine of its own as far as rendezvous and gloo can tell: the endpoint is the first node's
hostname, as Slurm gives it, and each node's agent decides from its hostname whether it hosts
the c10d store.

Needs root (`ip netns`, `unshare --uts`, a bind mount over /etc/hosts inside the namespace's
own mount namespace, which `ip netns exec` creates); `Cluster.create` raises Unavailable with
the reason where that is not permitted. Nothing outside the namespaces is changed: the hub
namespace holds the bridge, each node's veth pair lives in its node's and the hub's namespace,
and deleting the namespaces removes everything.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
START_S = 120      # a loaded 2-core box: torch imported by every launcher and every rank
END_S = 60
SUBNET = "10.77.0"           # private to the namespaces: no clash with the host or other runs
RDZV_PORT = 29400
# Runs as the node: its hosts file over /etc/hosts, its hostname, then the launcher (exec: the
# Popen's pid is smartlaunch's).
_AS_NODE = 'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"'
_DROP = ("PET_", "SLURM_", "SMARTLAUNCH_", "TORCHELASTIC_", "NCCL_", "GLOO_")
_DROP_NAMES = ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
               "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "ROLE_RANK")

# The job: gloo, one all-reduce, a line per rank; then, by mode, the end ("once"), a failure of
# the ranks on one node after the others were told ("fail NODE"), or all-reduces until stopped
# ("wait"). SL_TEST_NODE names the node (its launcher's environment reaches the ranks).
JOB_SCRIPT = """\
import os, sys, time
import torch
import torch.distributed as dist

node = os.environ["SL_TEST_NODE"]
mode = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(1)
dist.all_reduce(t)
print(f"job: rank {rank} world {world} node {node} sum {t.item():g}", flush=True)
if mode == "fail" and node == sys.argv[2]:
    raise RuntimeError(f"deliberate failure of rank {rank} on node {node}")
if mode in ("fail", "wait"):
    while True:
        dist.all_reduce(t)
        time.sleep(0.05)
dist.destroy_process_group()
"""


# A training job whose cost is known: each step "computes" for STEP_S (a sleep: the device
# works, the host waits, as on a GPU node; the model's own host work is a few ms) and
# all-reduces a gradient of GRAD_BYTES through DDP over gloo; rank 0 prints the job's
# samples/s over the steps after the first two.
TRAIN_SCRIPT = """\
import os, sys, time
import torch

step_s, grad_bytes, steps = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
batch = int(sys.argv[4]) if len(sys.argv) > 4 else 8
world = int(os.environ.get("WORLD_SIZE", "1"))
torch.set_num_threads(1)


class Model(torch.nn.Module):       # every parameter gets a gradient, at little host work
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(max(16, grad_bytes // 4)))

    def forward(self, x):
        return self.w[:16] * x


model = Model()
if world > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.0)
x = torch.ones(batch, 16)
for i in range(steps):
    if i == 2:
        t0 = time.perf_counter()
    time.sleep(step_s)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
rate = (steps - 2) * batch * world / (time.perf_counter() - t0)
if int(os.environ.get("RANK", "0")) == 0:
    print(f"train: world {world} samples/s {rate:.3f}", flush=True)
"""


def smartlaunch_lines(node) -> list[str]:
    return [line for line in node.output.splitlines() if line.startswith("smartlaunch: ")]


def printed_plan(node) -> dict:
    """The --explain=json plan a launcher printed."""
    out = node.output
    return json.JSONDecoder().raw_decode(out[out.index("{"):])[0]


def fake(name: str) -> dict:
    from helpers_common import fixture_path
    return {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path(name)}


# One variant of a sweep (--each): its record, a file of its own in the directory its first
# argument names (the variant's global index, the sweep's size, the node that ran it, its
# args); then it exits 3 when its args hold --fail, else 0.
EACH_SCRIPT = """\
import json, os, sys

out, args = sys.argv[1], sys.argv[2:]
index, node = os.environ["SMARTLAUNCH_JOB_INDEX"], os.environ["SL_TEST_NODE"]
record = {"index": int(index), "jobs": int(os.environ["SMARTLAUNCH_NUM_JOBS"]),
          "node": int(node), "args": args}
with open(os.path.join(out, f"variant-{index}-node-{node}-{os.getpid()}.json"), "x") as f:
    json.dump(record, f)
sys.exit(3 if "--fail" in args else 0)
"""


class Unavailable(Exception):
    """Network namespaces cannot be made here; the message says why."""


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")


class Node:
    """One launcher on a node: its merged stdout/stderr, read line by line as it comes."""

    def __init__(self, index: int, argv: list[str], env: dict, cwd: Path):
        self.index = index
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace",
                                     start_new_session=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    @property
    def output(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_line(self, pattern: str, timeout: float) -> re.Match:
        """The first line matching `pattern` (re.search), waiting for it at most `timeout` s."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = 0
            while True:
                for line in self.lines[seen:]:
                    m = rx.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    raise AssertionError(f"node {self.index}: no line matching {pattern!r} "
                                         f"within {timeout:g} s; output:\n{self.output_tail()}")
                self._cond.wait(left)

    def wait(self, timeout: float) -> int:
        """The launcher's exit code, once it has exited and its output is read."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node {self.index}: launcher still running after {timeout:g} "
                                 f"s; output:\n{self.output_tail()}") from None
        self._reader.join(timeout=10)
        return code

    def output_tail(self, n: int = 60) -> str:
        return "\n".join(self.lines[-n:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)


class Cluster:
    """`n` nodes on one bridge: node k is SUBNET.(k+1), hostname `node<k>-<tag>`. create()
    makes them; close() ends every launcher and job process left and deletes the namespaces."""

    def __init__(self, root: Path, n: int):
        self.root, self.n = root, n
        self.tag = uuid.uuid4().hex[:8]
        self.hub = f"slmn{self.tag}h"
        self.spaces = [f"slmn{self.tag}n{k}" for k in range(n)]
        self.hostnames = [f"node{k}-{self.tag}" for k in range(n)]
        self.script = root / f"job-{self.tag}.py"     # in every job process's command line
        self.train = root / f"train-{self.tag}.py"    # TRAIN_SCRIPT, likewise
        self.each = root / f"each-{self.tag}.py"      # EACH_SCRIPT, likewise
        self.nodes: list[Node] = []
        self._made: list[str] = []

    @property
    def endpoint(self) -> str:
        return f"{self.hostnames[0]}:{RDZV_PORT}"

    def create(self) -> "Cluster":
        for tool in ("ip", "unshare", "mount", "hostname"):
            if shutil.which(tool) is None:
                raise Unavailable(f"`{tool}` is not installed")
        try:
            self._add(self.hub)
        except RuntimeError as exc:
            raise Unavailable(f"network namespaces are not permitted here ({exc}); the "
                              f"multi-node tests need root and `ip netns`") from None
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        hosts = ["127.0.0.1 localhost"] + [f"{SUBNET}.{k + 1} {h}"
                                           for k, h in enumerate(self.hostnames)]
        self.hosts_file = self.root / "hosts"
        self.hosts_file.write_text("\n".join(hosts) + "\n")
        for k, ns in enumerate(self.spaces):
            self._add(ns)
            _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p{k}",
                "netns", self.hub)
            _ip("-n", self.hub, "link", "set", f"p{k}", "master", "br0")
            _ip("-n", self.hub, "link", "set", f"p{k}", "up")
            _ip("-n", ns, "addr", "add", f"{SUBNET}.{k + 1}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        try:        # the whole chain, once: a sandbox may allow namespaces but not the mount
            probe = subprocess.run(self._as_node(0, ["hostname"]), capture_output=True,
                                   text=True, timeout=30)
        except OSError as exc:
            raise Unavailable(f"cannot run a command as a node ({exc})") from None
        if probe.returncode != 0 or probe.stdout.strip() != self.hostnames[0]:
            raise Unavailable(f"cannot run a command as a node (hostname and hosts file in its "
                              f"namespaces): {probe.stderr.strip() or probe.stdout.strip()}")
        self.script.write_text(JOB_SCRIPT)
        self.train.write_text(TRAIN_SCRIPT)
        self.each.write_text(EACH_SCRIPT)
        return self

    def shape(self, rate: str) -> str:
        """Every node's link limited to `rate` (tc's words: "1gbit") by a token bucket on its
        eth0, with 0.2 ms of delay where the kernel has netem; the qdisc used, in words."""
        bits = float(re.match(r"[\d.]+", rate)[0]) * {"k": 1e3, "m": 1e6, "g": 1e9}[
            rate.rstrip("bit")[-1].lower()]
        burst = max(32 << 10, int(bits / 8 / 250))         # 4 ms of traffic
        used = ""
        for ns in self.spaces:
            try:
                _ip("netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root",
                    "netem", "delay", "0.2ms", "rate", rate)
                used = f"netem rate {rate} delay 0.2ms"
            except RuntimeError:     # no sch_netem in this kernel: the rate alone
                _ip("netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root",
                    "tbf", "rate", rate, "burst", str(burst), "latency", "50ms")
                used = f"tbf rate {rate} burst {burst} (no netem here: no added delay)"
        return used

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self._made.append(ns)

    def _as_node(self, k: int, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.spaces[k], "unshare", "--uts", "sh", "-c",
                _AS_NODE, "sh", str(self.hosts_file), self.hostnames[k], *argv]

    def env(self, k: int) -> dict:
        """Node k's environment: its own HOME, cache, log and lease directories."""
        env = {key: v for key, v in os.environ.items()
               if not key.startswith(_DROP) and key not in _DROP_NAMES}
        home = self.root / f"node{k}"
        (home / "cache").mkdir(parents=True, exist_ok=True)
        env.update(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"),
                   SMARTLAUNCH_LEASE_DIR=str(home / "leases"), SL_TEST_NODE=str(k),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                            os.environ.get("PYTHONPATH")])))
        return env

    def launch(self, k: int, *options: str, job: tuple[str, ...] = ("once",),
               nnodes: int | None = None, join_timeout: int = 60,
               env: dict | None = None, script: Path | None = None,
               static: bool = False) -> Node:
        """smartlaunch on node k: `--nnodes` (default: every node), c10d on the first node
        (static: --rdzv-backend static, --node-rank k), OPTIONS, then the job script with
        `job` as its arguments; `env` added to the node's."""
        rdzv = ["--rdzv-backend", "static", "--master-addr", self.hostnames[0],
                "--node-rank", str(k)] if static else \
            ["--rdzv-backend", "c10d", "--rdzv-endpoint", self.endpoint, "--rdzv-id",
             f"job-{self.tag}", "--rdzv-conf", f"join_timeout={join_timeout}"]
        argv = [sys.executable, "-m", "smartlaunch.cli", "--nnodes", str(nnodes or self.n),
                *rdzv, "--monitor-interval", "0.2", *options, str(script or self.script), *job]
        cwd = self.root / f"node{k}"
        cwd.mkdir(parents=True, exist_ok=True)
        node = Node(k, self._as_node(k, argv), {**self.env(k), **(env or {})}, cwd)
        self.nodes.append(node)
        return node

    def arrival_probe(self, k: int = 1, timeout: float = START_S) -> subprocess.Popen:
        """A process in node k's namespace that exits 0 once the store node 0 hosts counts a
        node that has joined (smartlaunch's "arrived" counter), 1 at the timeout. Started
        before the launchers, it has imported torch by then and sees the join within ~0.1 s."""
        probe = textwrap.dedent("""
            import datetime, sys, time
            from torch.distributed import PrefixStore, TCPStore
            host, port, prefix, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
            deadline = time.monotonic() + timeout
            store = None
            while time.monotonic() < deadline:
                try:
                    if store is None:
                        store = PrefixStore(prefix, TCPStore(
                            host, port, is_master=False, wait_for_workers=False,
                            timeout=datetime.timedelta(seconds=2)))
                    if store.add("arrived", 0) >= 1:
                        sys.exit(0)
                except (RuntimeError, ValueError):
                    store = None
                time.sleep(0.1)
            sys.exit(1)
        """)
        return subprocess.Popen(
            ["ip", "netns", "exec", self.spaces[k], sys.executable, "-c", probe, f"{SUBNET}.1",
             str(RDZV_PORT), f"smartlaunch/job-{self.tag}/", str(timeout)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def job_processes(self) -> list[psutil.Process]:
        """Every live process of this cluster's job: launchers' ranks, by the script path."""
        out = []
        for p in psutil.process_iter(["cmdline", "status"]):
            try:
                if p.info["status"] != psutil.STATUS_ZOMBIE and \
                        any(str(s) in a for a in p.info["cmdline"] or ()
                            for s in (self.script, self.train, self.each)):
                    out.append(p)
            except (psutil.Error, TypeError):
                continue
        return out

    def left_running(self, timeout: float = 10.0) -> list[str]:
        """The job's processes still alive `timeout` s after the launchers ended (waited on
        as they exit, not slept); [] when none is."""
        procs = [p for p in self.job_processes() if p.pid != os.getpid()]
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        out = []
        for p in alive:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"pid {p.pid}: {' '.join(p.cmdline())}")
            except psutil.Error:
                continue
        return out

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        for p in self.job_processes():
            try:
                p.kill()
            except psutil.Error:
                pass
        for ns in reversed(self._made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self._made.clear()
