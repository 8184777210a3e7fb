"""A real single-node Slurm (Debian's slurm-wlm 22.05 + munge) for the Slurm tests.

Started once per session without systemd: munged as the munge user on a private socket,
`slurmctld -i` and `slurmd` daemonizing with PID files in a temp dir; stopped by PID at the
end. Client calls go through `timeout`, as they block ~10 s per retry when slurmctld is down.
Skipped (with the reason) where the packages or root are missing: `.ci/install-slurm.sh`.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "tests" / "slurm"
HOOKS = REPO / "smartlaunch" / "slurm" / "scripts"
LUA_CAP = 1          # below the node's 2 GPUs, so a satisfiable request is refused by policy
PROGRAMS = ("slurmctld", "slurmd", "munged", "srun", "sbatch", "scontrol", "squeue", "lua5.3")


def missing_reason() -> str | None:
    if sys.platform != "linux":
        return "Slurm tests need Linux"
    if os.geteuid() != 0:
        return "Slurm tests need root (slurmd, munged, mknod); run them in CI's container"
    absent = [p for p in PROGRAMS if not (shutil.which(p) or os.path.exists(f"/usr/sbin/{p}"))]
    if absent:
        return f"missing {', '.join(absent)}: run .ci/install-slurm.sh (apt slurm-wlm munge lua5.3)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    def __init__(self, root: Path, task_plugin: str = "task/affinity"):
        self.dir = root
        self.host = socket.gethostname().split(".")[0]
        self.task_plugin = task_plugin
        self.conf = root / "slurm.conf"
        self.hooks_env = root / "hooks" / "hooks.env"
        self.state_dir = root / "node-state"
        self.pids: dict[str, int] = {}
        self.made_devices: list[Path] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for k in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))]:
            if k != "SLURM_CONF":
                del self.env[k]

    # ---- set-up ----------------------------------------------------------------------
    def write_config(self, hooks_settings: dict[str, str]) -> None:
        d = self.dir
        for sub in ("state", "spool", "munge", "hooks", "node-state", "shared"):
            (d / sub).mkdir(exist_ok=True)
        os.chmod(d / "shared", 0o1777)      # job output and pid files of unprivileged jobs
        subst = {"@HOST@": self.host, "@DIR@": str(d), "@CTLD_PORT@": str(free_port()),
                 "@SLURMD_PORT@": str(free_port()), "@CPUS@": str(os.cpu_count() or 2),
                 "@TASK_PLUGIN@": self.task_plugin}
        text = (TEMPLATES / "slurm.conf.in").read_text()
        for k, v in subst.items():
            text = text.replace(k, v)
        self.conf.write_text(text)
        shutil.copy(TEMPLATES / "gres.conf.in", d / "gres.conf")
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nConstrainDevices=no\n")
        # JobSubmitPlugins=lua reads job_submit.lua next to slurm.conf.
        lua = (HOOKS / "job_submit.lua").read_text()
        capped = lua.replace("local MAX_GPUS_PER_JOB = 8 ", f"local MAX_GPUS_PER_JOB = {LUA_CAP} ")
        assert capped != lua, "job_submit.lua no longer has the MAX_GPUS_PER_JOB line"
        (d / "job_submit.lua").write_text(capped)
        # Copies of the hooks, so their sibling hooks.env (the admin's config) is the test's.
        for name in ("prolog", "epilog"):
            shutil.copy(HOOKS / name, d / "hooks" / name)
            os.chmod(d / "hooks" / name, 0o755)
        self.set_hooks_env(hooks_settings)
        for i in range(2):
            dev = Path(f"/dev/nvidia{i}")
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(195, i))
                self.made_devices.append(dev)

    def set_hooks_env(self, settings: dict[str, str]) -> None:
        base = {"SMARTLAUNCH_PYTHON": sys.executable, "SMARTLAUNCH_STATE_DIR": str(self.state_dir)}
        lines = [f"{k}={v}" for k, v in {**base, **settings}.items()]
        self.hooks_env.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        self._start_controller()
        self._daemon("slurmd", [_sbin("slurmd"), "-f", str(self.conf)], self.dir / "slurmd.pid")
        self.wait_node_idle()

    def _start_controller(self) -> None:
        """munged and slurmctld, the daemons every cluster of these tests has."""
        d = self.dir
        os.chown(d / "munge", _uid("munge"), _gid("munge"))
        os.chmod(d / "munge", 0o755)
        self._daemon("munged", ["runuser", "-u", "munge", "--", _sbin("munged"), "--force",
                                f"--socket={d}/munge/munge.socket",
                                f"--pid-file={d}/munge/munged.pid",
                                f"--log-file={d}/munge/munged.log",
                                f"--seed-file={d}/munge/munged.seed"], d / "munge" / "munged.pid")
        self._daemon("slurmctld", [_sbin("slurmctld"), "-i", "-f", str(self.conf)],
                     d / "slurmctld.pid")

    def _daemon(self, name: str, argv: list[str], pid_file: Path) -> None:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{name} failed to start ({done.returncode}): "
                               f"{done.stderr.strip()}\n{self.logs()}")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if pid_file.exists() and pid_file.read_text().strip():
                self.pids[name] = int(pid_file.read_text().split()[0])
                return
            time.sleep(0.05)
        raise RuntimeError(f"{name} wrote no PID file {pid_file}\n{self.logs()}")

    def wait_node_idle(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.node_state()
            if state.split("+")[0] in ("IDLE", "MIXED", "ALLOCATED") and "DRAIN" not in state:
                return
            time.sleep(0.2)
        raise RuntimeError(f"node not idle after {timeout} s (state {state})\n{self.logs()}")

    def quiesce(self, timeout: float = 30) -> None:
        """No jobs left and no epilog running (node not COMPLETING): safe to change hooks.env."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            queue = self.client("squeue", "-h", "-o", "%i %T", timeout=15).stdout.strip()
            if not queue and "COMPLETING" not in self.node_state():
                return
            time.sleep(0.2)
        raise RuntimeError(f"jobs still present after {timeout} s: {queue}\n{self.logs()}")

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            pid = self.pids.pop(name, None)
            if pid is not None:
                _stop_pid(pid)
        for dev in self.made_devices:       # other tests must not mistake them for a driver
            dev.unlink(missing_ok=True)
        self.made_devices.clear()

    # ---- clients ---------------------------------------------------------------------
    def client(self, *argv: str, timeout: int = 30, check: bool = False,
               env: dict | None = None, cwd: str | None = None) -> subprocess.CompletedProcess:
        cmd = ["timeout", "-k", "2", str(timeout), *argv]
        return subprocess.run(cmd, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout + 5, check=check, cwd=cwd)

    def node(self) -> dict[str, str]:
        from smartlaunch.scheduler.slurm_parse import parse_key_values
        out = self.client("scontrol", "-o", "show", "node", self.host, timeout=15)
        return parse_key_values(out.stdout)

    def node_state(self) -> str:
        return self.node().get("State", "")

    def job(self, job_id: str) -> dict[str, str]:
        from smartlaunch.scheduler.slurm_parse import parse_key_values
        return parse_key_values(self.client("scontrol", "-o", "show", "job", job_id).stdout)

    def wait_job(self, job_id: str, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
                 timeout: float = 30) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {info}\n{self.logs()}")

    def resume(self) -> None:
        self.client("scontrol", "update", f"nodename={self.host}", "state=resume", timeout=15)
        self.wait_node_idle()

    def logs(self, tail: int = 30) -> str:
        out = []
        slurmds = sorted(p.name for p in self.dir.glob("slurmd*.log"))
        for name in ("slurmctld.log", *slurmds, "munge/munged.log"):
            p = self.dir / name
            if p.exists():
                lines = p.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(out)


class NodesCluster(SlurmCluster):
    """Several slurmd on this host, one per node name (`slurmd -N n1`, each its own port, spool
    and PID file), so jobs span real nodes of one slurmctld. No node hooks; its job_submit.lua
    refuses job modifications while `deny_modify` exists (a site that forbids resizing)."""

    def __init__(self, root: Path, names: tuple[str, ...] = ("n1", "n2")):
        super().__init__(root)
        self.names = names
        self.deny_modify = root / "deny-modify"

    def write_config(self, hooks_settings: dict[str, str]) -> None:
        super().write_config(hooks_settings)
        d = self.dir
        drop = ("NodeName=", "PartitionName=", "SlurmdPidFile=", "SlurmdSpoolDir=",
                "SlurmdLogFile=", "Prolog=", "Epilog=")
        lines = [x for x in self.conf.read_text().splitlines() if not x.startswith(drop)]
        lines += [f"SlurmdPidFile={d}/slurmd-%n.pid", f"SlurmdSpoolDir={d}/spool-%n",
                  f"SlurmdLogFile={d}/slurmd-%n.log"]
        lines += [f"NodeName={n} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={free_port()} "
                  f"CPUs=1 RealMemory=1000 Gres=gpu:2 State=UNKNOWN" for n in self.names]
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (d / "job_submit.lua").write_text(f"""\
function slurm_job_submit(job_desc, part_list, submit_uid)
   return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   local f = io.open("{self.deny_modify}", "r")
   if f ~= nil then
      f:close()
      slurm.log_user("site policy: jobs may not be resized here")
      return slurm.ERROR
   end
   return slurm.SUCCESS
end
return slurm.SUCCESS
""")

    def start(self) -> None:
        d = self.dir
        self._start_controller()
        for n in self.names:
            (d / f"spool-{n}").mkdir(exist_ok=True)
            self._daemon(f"slurmd-{n}", [_sbin("slurmd"), "-N", n, "-f", str(self.conf)],
                         d / f"slurmd-{n}.pid")
        deadline = time.monotonic() + 30
        states: list[str] = []
        while time.monotonic() < deadline:
            out = self.client("sinfo", "-h", "-N", "-o", "%N %T", timeout=15).stdout.split("\n")
            states = [x.split()[-1] for x in out if x.strip()]
            if len(states) == len(self.names) and all(s == "idle" for s in states):
                return
            time.sleep(0.2)
        raise RuntimeError(f"nodes not idle after 30 s ({states})\n{self.logs()}")

    def stop(self) -> None:
        for n in self.names:                 # slurmd first, as the one-node cluster does
            pid = self.pids.pop(f"slurmd-{n}", None)
            if pid is not None:
                _stop_pid(pid)
        super().stop()


def _stop_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def slurm_nodes():
    """A two-node Slurm (NodesCluster) for one test module."""
    yield from _running(NodesCluster, "smartlaunch-slurm-nodes-", {})


def _running(kind, prefix: str, config: dict):
    """A started cluster of `kind` for a fixture to yield; stopped and removed after."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o755)
    cluster = kind(root)
    cluster.write_config(config)
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        raise
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _uid(user: str) -> int:
    import pwd
    return pwd.getpwnam(user).pw_uid


def _gid(group: str) -> int:
    import grp
    return grp.getgrnam(group).gr_gid


@pytest.fixture(scope="session")
def slurm_cluster():
    yield from _running(SlurmCluster, "smartlaunch-slurm-",
                        {"SMARTLAUNCH_FAKE_TOPOLOGY": fake_topology("healthy")})


def fake_topology(name: str) -> str:
    """A node fixture for the hooks: tests/slurm/<name>.json."""
    return str(TEMPLATES / f"topo-{name}.json")


def topology_running(name: str, processes: dict[int, int], pid_text: str | None = None) -> str:
    """The fixture `name` as JSON text with the GPU processes {pid: physical GPU} on it, the
    way NVML would list them. `pid_text` replaces the pid in the text (a placeholder a job
    script fills in with its own child's pid)."""
    import json
    node = json.loads(Path(fake_topology(name)).read_text())
    for pid, gpu in processes.items():
        g = next(g for g in node["gpus"] if g["nvml_index"] == gpu)
        g["processes"].append({"pid": pid, "user": None, "used_mib": 100, "ours": False})
    text = json.dumps(node, indent=1)
    if pid_text:
        text = text.replace(f'"pid": {next(iter(processes))},', f'"pid": {pid_text},')
    return text
