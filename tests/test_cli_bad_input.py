"""Bad input, table-driven (issue 13): every row exits with the README's code, says one line
on stderr (what is wrong and the fix), shows no traceback, and leaves nothing behind: no
process of its session, no new file in its working directory or home.

Rows run in one fixture, 2 at a time, each then its own test. Each row is a real process:
`fresh` rows a new interpreter exactly as the user types the command; the others are forked
from a python that imported torch once (helpers_zygote.py), then run the module as __main__ as
`python -m` would: 70 torch imports took 165 s of a loaded 2-core machine.
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from helpers_common import fixture_path, own_lines
from helpers_zygote import Zygote

README = Path(__file__).resolve().parent.parent / "README.md"
PAIR = fixture_path("h200-nv18-pair")
SL = [sys.executable, "-m", "smartlaunch.cli"]
NODE = [sys.executable, "-m", "smartlaunch.node_cli"]
HOOK = [sys.executable, "-I", "-m", "smartlaunch.slurm.hooks"]      # as the shell hooks run it
# What a zygote imports before its forks: torch (for torchrun's parser) and our entry points.
PRELOAD = ["torch.distributed.run", "smartlaunch.cli", "smartlaunch.pipeline", "smartlaunch.node_cli"]


@dataclass
class Row:
    name: str
    argv: list[str]
    code: int
    says: str                                    # a regex the one line must match
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str | bytes | None] = field(default_factory=dict)   # None: a directory
    modes: dict[str, int] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    fresh: bool = False                          # a new interpreter, not a zygote's fork


def policy(text: str) -> dict[str, str]:
    return {"p.yaml": text}


def topo(edit) -> dict[str, str]:
    """The NV18 pair's fixture as topo.json, after `edit(data)` spoils it."""
    data = json.loads(Path(PAIR).read_text())
    edit(data)
    return {"topo.json": json.dumps(data)}


FAKE = {"SMARTLAUNCH_FAKE_TOPOLOGY": "topo.json"}


ROWS = [
    # 2: the command line
    Row("no script", SL, 2, r"the following arguments are required: training_script",
        fresh=True),
    Row("unknown option", SL + ["--bogus", "t.py"], 2, r"unrecognized arguments: --bogus"),
    Row("nproc zero", SL + ["--nproc-per-node", "0", "t.py"], 2, r"--nproc-per-node 0 must be at least 1"),
    Row("nproc word", SL + ["--nproc-per-node", "two", "t.py"], 2, r"'two' is not a number"),
    Row("nproc above GPUs", SL + ["--nproc-per-node", "4", "t.py"], 2, r"--nproc-per-node 4",
        env={"SMARTLAUNCH_FAKE_TOPOLOGY": PAIR}),
    Row("strategy unknown", SL + ["--strategy", "fast", "t.py"], 2, r"invalid choice: 'fast'"),
    Row("explain format", SL + ["--explain=xml", "t.py"], 2, r"invalid choice: 'xml'"),
    Row("explain format as a separate word", SL + ["--explain", "xml", "t.py"], 2,
        r"training script not found: xml \(if xml was meant as --explain's format, write --explain=xml"),
    Row("nnodes reversed", SL + ["--nnodes", "3:1", "t.py"], 2, r"--nnodes '3:1' is not N or MIN:MAX"),
    Row("ddp nnodes reversed", SL + ["--strategy", "ddp", "--nnodes", "3:1", "t.py"], 2,
        r"--nnodes '3:1'"),
    Row("nnodes zero", SL + ["--nnodes", "0", "t.py"], 2, r"--nnodes '0'"),
    Row("nnodes words", SL + ["--nnodes", "a:b", "t.py"], 2, r"--nnodes 'a:b'"),
    Row("single over nodes", SL + ["--strategy", "single", "--nnodes", "2", "t.py"], 2,
        r"--strategy single runs one process on one node, but --nnodes 2 makes one job across "
        r"nodes; use --strategy ddp \(or auto, which launches it as torchrun would\), --each"),
    Row("independent over nodes without variants", SL + ["--strategy", "independent", "--nnodes",
        "2", "t.py"], 2, r"--strategy independent needs variants: give --each or --each-file to "
        r"split them over the nodes \(--nnodes 2\), or use --strategy ddp"),
    Row("each over a node range", SL + ["--nnodes", "1:2", "--each", "--lr 1", "t.py"], 2,
        r"--each/--each-file split the variants over a fixed number of nodes, but --nnodes 1:2 "
        r"is a range; give --nnodes N"),
    Row("script missing", SL + ["missing.py"], 2, r"training script not found: missing.py"),
    Row("script is a directory", SL + ["adir"], 2, r"training script adir is a directory",
        files={"adir": None}),
    Row("script dir named .py", SL + ["pkg.py"], 2, r"pkg.py is a directory", files={"pkg.py": None}),
    Row("module missing", SL + ["-m", "no_such_module_xyz"], 2, r"module not found: no_such_module_xyz"),
    Row("submodule missing", SL + ["-m", "json.no_such_sub"], 2, r"module not found: json.no_such_sub"),
    Row("package without main", SL + ["-m", "json"], 2, r"json is a package without __main__.py"),
    Row("program missing", SL + ["--no-python", "no-such-program-xyz"], 2, r"program not found"),
    Row("rdzv backend unknown", SL + ["--strategy", "ddp", "--nproc-per-node", "2",
                                      "--rdzv-backend", "bogus", "t.py"], 2,
        r"--rdzv-backend 'bogus': not a rendezvous backend .*use one of .*c10d"),
    Row("rdzv conf without value", SL + ["--strategy", "ddp", "--nproc-per-node", "2",
                                         "--rdzv-conf", "junk", "t.py"], 2,
        r"--rdzv-conf 'junk': .*must have a value.*KEY=VALUE"),
    # .invalid never resolves (RFC 2606); torch's store retried it silently for its timeout
    Row("rdzv endpoint host unknown", SL + ["--strategy", "ddp", "--nproc-per-node", "2", "--nnodes",
                                            "2", "--rdzv-endpoint", "node0.invalid:29400", "t.py"],
        2, r"--rdzv-endpoint 'node0.invalid:29400': its host 'node0.invalid' does not resolve "
           r"here .*give the first node's hostname"),
    Row("master addr unknown", SL + ["--strategy", "ddp", "--nproc-per-node", "2",
                                     "--master-addr", "node0.invalid", "t.py"], 2,
        r"--master-addr 'node0.invalid': its host 'node0.invalid' does not resolve here"),
    Row("rdzv endpoint port word", SL + ["--strategy", "ddp", "--nproc-per-node", "2",
                                         "--rdzv-endpoint", "host:notaport", "t.py"], 2,
        r"--rdzv-endpoint 'host:notaport': the port number .*HOST:PORT"),
    Row("rdzv endpoint colons explained", SL + ["--explain", "--nnodes", "2", "--rdzv-endpoint",
                                                ":::", "t.py"], 2, r"--rdzv-endpoint ':::'"),
    Row("rdzv endpoint from PET", SL + ["--explain", "t.py"], 2, r"PET_RDZV_ENDPOINT='x:y'",
        env={"PET_RDZV_ENDPOINT": "x:y"}),
    Row("nproc from PET", SL + ["--explain", "t.py"], 2, r"PET_NPROC_PER_NODE='abc' is not a number",
        env={"PET_NPROC_PER_NODE": "abc"}),
    Row("program in cwd, not on PATH", SL + ["--no-python", "t.py"], 2,
        r"t.py is not on PATH .*use ./t.py and chmod \+x t.py"),
    Row("program not executable", SL + ["--no-python", "./t.py"], 2,
        r"./t.py is not executable; chmod \+x ./t.py"),
    Row("program without #!", SL + ["--no-python", "./t.py"], 2, r"./t.py has no #! line",
        modes={"t.py": 0o755}),
    Row("each with ddp", SL + ["--each", "--lr 1", "--strategy", "ddp", "t.py"], 2,
        r"cannot be combined with --strategy ddp"),
    Row("each-file missing", SL + ["--each-file", "none.txt", "t.py"], 2, r"none.txt"),
    Row("each-file over 1 MiB", SL + ["--explain", "--each-file", "big.txt", "t.py"], 2,
        r"--each-file big.txt is larger than 1 MiB", files={"big.txt": "--tag " + "a" * (1 << 20)}),
    Row("each-file endless", SL + ["--explain", "--each-file", "/dev/zero", "t.py"], 2,
        r"--each-file /dev/zero is larger than 1 MiB"),
    Row("each unclosed quote", SL + ["--each", "--name 'x", "t.py"], 2, r"--each"),
    Row("script's --debug is the script's", SL + ["--policy", "nope.yaml", "t.py", "--debug"], 3,
        r"policy file .*nope.yaml \(--policy\) not found"),
    # 3: policy, paths
    Row("policy is a directory", SL + ["--policy", "pdir", "t.py"], 3, r"pdir \(--policy\) is a directory",
        files={"pdir": None}),
    Row("policy unknown key", SL + ["--policy", "p.yaml", "t.py"], 3, r"p.yaml:1: decision.min_efficency",
        files=policy("decision: {min_efficency: 0.5}\n"), fresh=True),
    Row("policy wrong type", SL + ["--policy", "p.yaml", "t.py"], 3, r"decision.max_gpus: expected",
        files=policy("decision: {max_gpus: many}\n")),
    Row("policy out of range", SL + ["--policy", "p.yaml", "t.py"], 3, r"decision.min_efficiency",
        files=policy("decision: {min_efficiency: 2}\n")),
    Row("policy bad yaml", SL + ["--policy", "p.yaml", "t.py"], 3, r"p.yaml",
        files=policy("decision: {max_gpus: [\n")),
    Row("policy is a list", SL + ["--policy", "p.yaml", "t.py"], 3, r"p.yaml",
        files=policy("- 1\n- 2\n")),
    Row("user policy enforces", SL + ["--policy", "p.yaml", "t.py"], 3, r"only the admin policy",
        files=policy("enforce:\n  decision: {max_gpus: 1}\n")),
    Row("policy not utf-8", SL + ["--policy", "p.yaml", "t.py"], 3, r"not UTF-8",
        files={"p.yaml": b"decision: {max_gpus: \xff}\n"}),
    Row("policy too large", SL + ["--policy", "p.yaml", "t.py"], 3, r"larger than 1 MiB",
        files={"p.yaml": "# padding\n" * 120_000}),
    Row("fallback not allowed", SL + ["--policy", "p.yaml", "t.py"], 3, r"fallback_strategy=ddp",
        files=policy("decision: {allowed_strategies: [single], fallback_strategy: ddp}\n")),
    Row("log dir is a file", SL + ["--strategy", "ddp", "--nproc-per-node", "2", "t.py"], 3,
        r"launch.log_dir=afile \(env:SMARTLAUNCH_LOG_DIR\).* is not a directory",
        env={"SMARTLAUNCH_LOG_DIR": "afile"}, files={"afile": "x"}),
    Row("cache dir is a file", SL + ["t.py"], 3,
        r"paths.cache_dir=afile \(env:SMARTLAUNCH_CACHE_DIR\).* is not a directory",
        env={"SMARTLAUNCH_CACHE_DIR": "afile", "SMARTLAUNCH_FAKE_TOPOLOGY": PAIR}, files={"afile": "x"}),
    Row("log dir under a missing home", SL + ["--strategy", "single", "t.py"], 3,
        r"launch.log_dir=.*nohome/logs \(env:SMARTLAUNCH_LOG_DIR\): HOME=.*nohome does not "
        r"exist.*SMARTLAUNCH_LOG_DIR", env={"HOME": "{tmp}/nohome",
                                             "SMARTLAUNCH_LOG_DIR": "~/logs",
                                             "SMARTLAUNCH_FAKE_TOPOLOGY": PAIR}, fresh=True),
    Row("lease dir in /proc", SL + ["t.py"], 3, r"cannot create lease directory /proc/x",
        env={"SMARTLAUNCH_LEASE_DIR": "/proc/x", "SMARTLAUNCH_FAKE_TOPOLOGY": PAIR}),
    Row("lease dir is a file", SL + ["t.py"], 3, r"lease directory .*afile is not a directory",
        env={"SMARTLAUNCH_LEASE_DIR": "{tmp}/afile", "SMARTLAUNCH_FAKE_TOPOLOGY": PAIR},
        files={"afile": "x"}),
    Row("lease dir world-writable", SL + ["t.py"], 3, r"without the sticky bit",
        env={"SMARTLAUNCH_LEASE_DIR": "{tmp}/open", "SMARTLAUNCH_FAKE_TOPOLOGY": PAIR},
        files={"open": None}, modes={"open": 0o777}),
    Row("lease dir symlink", SL + ["t.py"], 3, r"is a symlink",
        env={"SMARTLAUNCH_LEASE_DIR": "{tmp}/link", "SMARTLAUNCH_FAKE_TOPOLOGY": PAIR},
        files={"real": None}, links={"link": "real"}),
    Row("fake topology missing", SL + ["t.py"], 2, r"SMARTLAUNCH_FAKE_TOPOLOGY=nope.json: no such file",
        env={"SMARTLAUNCH_FAKE_TOPOLOGY": "nope.json"}),
    Row("fake topology not json", SL + ["t.py"], 2, r"bad.json: not a topology JSON",
        env={"SMARTLAUNCH_FAKE_TOPOLOGY": "bad.json"}, files={"bad.json": "{not json"}),
    Row("fake topology link to no GPU", SL + ["--explain", "t.py"], 2,
        r"topo.json: not a topology JSON \(links\[0\].b is 7, not the index of a GPU",
        env=FAKE, files=topo(lambda d: d["links"][0].update(b=7))),
    Row("fake topology duplicate index", SL + ["t.py"], 2, r"two GPUs have index 0",
        env=FAKE, files=topo(lambda d: d["gpus"][1].update(index=0))),
    Row("fake topology memory word", SL + ["--explain", "t.py"], 2,
        r"gpus\[0\].memory_free_mib is 'lots', not an integer",
        env=FAKE, files=topo(lambda d: d["gpus"][0].update(memory_free_mib="lots"))),
    Row("fake topology cpus word", SL + ["--explain", "t.py"], 2,
        r"gpus\[1\].cpus is 'all', not a list of integers",
        env=FAKE, files=topo(lambda d: d["gpus"][1].update(cpus="all"))),
    Row("fake topology is a directory", SL + ["--explain", "t.py"], 2,
        r"SMARTLAUNCH_FAKE_TOPOLOGY=.*tdir is a directory; name a JSON topology file",
        env={"SMARTLAUNCH_FAKE_TOPOLOGY": "{tmp}/tdir"}, files={"tdir": None}),
    Row("visible devices name no GPU", SL + ["--strategy", "ddp", "t.py"], 2,
        r"CUDA_VISIBLE_DEVICES=9: '9' is out of range.*CUDA would see no GPU.*0 \(GPU-ef42a798",
        env={"SMARTLAUNCH_FAKE_TOPOLOGY": PAIR, "CUDA_VISIBLE_DEVICES": "9"}),
    Row("visible devices unknown uuid", SL + ["--explain", "t.py"], 2,
        r"CUDA_VISIBLE_DEVICES=GPU-0000.*matches no device",
        env={"SMARTLAUNCH_FAKE_TOPOLOGY": PAIR,
             "CUDA_VISIBLE_DEVICES": "GPU-00000000-1111-2222-3333-444444444444"}),
    # 4: no NVML where one is needed
    Row("baseline without NVML", NODE + ["baseline", "--config", "hooks.env"], 4, r"no GPU to record",
        files={"hooks.env": "SMARTLAUNCH_STATE_DIR={tmp}/state\n"}),
    # 5: no plan fits
    Row("ddp on one GPU", SL + ["--strategy", "ddp", "t.py"], 5, r"ddp",
        env={"SMARTLAUNCH_FAKE_TOPOLOGY": PAIR, "CUDA_VISIBLE_DEVICES": "0"}),
    Row("ddp on a forbidden link", SL + ["--strategy", "ddp", "--policy", "p.yaml", "t.py"], 3,
        r"decision.ddp_link_classes=\[PIX\]",
        env={"SMARTLAUNCH_FAKE_TOPOLOGY": PAIR}, files=policy("decision: {ddp_link_classes: [PIX]}\n")),
    # 9: Slurm
    Row("slurm job id only", SL + ["t.py"], 9, r"SLURM_JOB_NODELIST is not",
        env={"SLURM_JOB_ID": "123"}),
    Row("slurm job id not a number", SL + ["t.py"], 9, r"is not a job number", env={"SLURM_JOB_ID": "abc"}),
    Row("prolog outside slurmd", NODE + ["prolog", "--config", "hooks.env"], 9,
        r"SLURM_JOB_UID, SLURM_JOB_USER not set", env={"SLURM_JOB_ID": "123"},
        files={"hooks.env": "SMARTLAUNCH_STATE_DIR={tmp}/state\n"}),
    Row("epilog with a bad uid", NODE + ["epilog", "--config", "hooks.env"], 9,
        r"SLURM_JOB_UID='x' is not a uid",
        env={"SLURM_JOB_ID": "123", "SLURM_JOB_UID": "x", "SLURM_JOB_USER": "ann"},
        files={"hooks.env": "SMARTLAUNCH_STATE_DIR={tmp}/state\n"}),
    Row("prolog config is a directory", HOOK + ["prolog", "--config", "cdir"], 10,
        r"hooks config cdir is a directory; name the hooks.env file", files={"cdir": None}),
    Row("node prolog config is a directory", NODE + ["prolog", "--config", "/tmp"], 10,
        r"hooks config /tmp is a directory"),
    # node commands
    Row("node unknown command", NODE + ["bogus"], 2, r"invalid choice: 'bogus'", fresh=True),
    Row("node unknown option", NODE + ["topo", "--bogus"], 2, r"unrecognized arguments: --bogus"),
    Row("calibrate without GPUs", NODE + ["calibrate"], 2, r"needs 2 distinct GPUs.*run it on a node"),
    Row("policy check missing file", NODE + ["policy", "check", "nope.yaml"], 3, r"nope.yaml not found"),
    Row("policy check too large", NODE + ["policy", "check", "p.yaml"], 3, r"larger than 1 MiB",
        files={"p.yaml": "#\n" * 600_000}),
    Row("policy check directory", NODE + ["policy", "check", "pdir"], 3, r"pdir is a directory",
        files={"pdir": None}),
]


def _setup(row: Row, tmp: Path) -> dict[str, str]:
    (tmp / "t.py").write_text("print('ran')\n")
    for name, content in row.files.items():
        path = tmp / name
        if content is None:
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content.replace("{tmp}", str(tmp)))
    for name, mode in row.modes.items():
        os.chmod(tmp / name, mode)
    for name, target in row.links.items():
        os.symlink(tmp / target, tmp / name)
    return {k: v.replace("{tmp}", str(tmp)) for k, v in row.env.items()}


def _tree(tmp: Path) -> set[str]:
    return {str(p.relative_to(tmp)) for p in tmp.rglob("*")}


def _run(row: Row, tmp: Path, base_env: dict[str, str], zygotes: queue.Queue) -> dict:
    tmp.mkdir()
    (tmp / "home").mkdir()
    env = dict(base_env, HOME=str(tmp / "home"), XDG_CACHE_HOME=str(tmp / "home" / ".cache"),
               SMARTLAUNCH_LEASE_DIR=str(tmp / "leases"))
    env.update(_setup(row, tmp))
    before = _tree(tmp)
    module = next((m for m in (SL, NODE) if row.argv[:len(m)] == m), None)
    if module is None or row.fresh:
        proc = subprocess.Popen(row.argv, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        pid, rc = proc.pid, proc.returncode
    else:
        zygote = zygotes.get()
        try:
            pid, rc = zygote.run(module[-1], row.argv[len(module):], tmp, env,
                                 tmp.parent / f"{tmp.name}-std", timeout=180)
        finally:
            zygotes.put(zygote)
        out = (tmp.parent / f"{tmp.name}-std.out").read_text()
        err = (tmp.parent / f"{tmp.name}-std.err").read_text()
    left = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == pid:
                left.append(p.pid)
        except OSError:
            pass
    return {"rc": rc, "stdout": out, "stderr": err, "left": left,
            "new_files": sorted(_tree(tmp) - before)}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "SMARTLAUNCH_", "PET_", "NCCL_", "CUDA_"))}
    root = tmp_path_factory.mktemp("bad input")          # a space in every path
    zygotes: queue.Queue = queue.Queue()
    for _ in range(2):
        zygotes.put(Zygote(PRELOAD, base))
    try:
        with ThreadPoolExecutor(2) as pool:
            futures = {row.name: pool.submit(_run, row, root / f"row{i}", base, zygotes)
                       for i, row in enumerate(ROWS)}
            return {name: f.result() for name, f in futures.items()}
    finally:
        while not zygotes.empty():
            zygotes.get().close()


def test_at_least_forty_rows_and_unique_names():
    assert len(ROWS) >= 40 and len({r.name for r in ROWS}) == len(ROWS)


def test_every_code_the_table_uses_is_in_the_readmes_exit_code_table():
    section = README.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", section, re.M)}
    assert {r.code for r in ROWS} <= documented


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_bad_input(results, row):
    got = results[row.name]
    lines = own_lines(got["stderr"])
    assert got["rc"] == row.code, got["stderr"][-3000:]
    assert "Traceback" not in got["stderr"]
    assert len(lines) == 1, lines
    assert re.match(r"smartlaunch(-node| \w+)?: error: ", lines[0]), lines[0]
    assert re.search(row.says, lines[0]), lines[0]
    assert got["left"] == [], f"processes left running: {got['left']}"
    assert got["new_files"] == [], f"files left behind: {got['new_files']}"


def test_a_directory_or_unreadable_file_named_py_beside_the_script_is_not_code(tmp_path):
    # Issue 13: both gave a traceback in the profile key (IsADirectoryError, PermissionError).
    from smartlaunch.policy.api import Policy
    from smartlaunch.profile.cache import profile_key
    from smartlaunch.request import Request
    (tmp_path / "train.py").write_text("print(1)\n")
    request = Request(script="train.py")

    def key() -> str:
        return profile_key(request, Policy(), gpu_model="x", environ={}, cwd=str(tmp_path))
    plain = key()
    (tmp_path / "models.py").mkdir()
    secret = tmp_path / "secret.py"
    secret.write_text("x = 1\n")
    secret.chmod(0)
    try:
        assert key() != "" and (os.geteuid() == 0 or key() == plain)
    finally:
        secret.chmod(0o644)
