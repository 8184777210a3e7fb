"""The CLI end to end on CPU: forced strategies, exit codes, explain, bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_common import EXAMPLES, fixture_path, own_lines

SCRIPTS = Path(__file__).parent / "scripts_cli"


def smartlaunch(args, cwd, env_extra=None, timeout=120):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "smartlaunch.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _wait_for(p, word: str, n: int) -> None:
    """Until the job printed word n times: ranks' unbuffered lines may interleave (`python -u`,
    as under torchrun), "readyready\n\n"."""
    seen = ""
    while seen.count(word) < n:
        line = p.stdout.readline()
        assert line, seen
        seen += line


def torchrun(args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def test_ddp_on_cpu_trains_and_exits_0(clean_env):
    r = smartlaunch(["--strategy", "ddp", "--nproc-per-node", "2", str(EXAMPLES / "train.py"),
                     "--steps", "5", "--warmup", "1"], clean_env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "world=2" in r.stdout and "throughput: samples/s=" in r.stdout


@pytest.mark.slow
def test_rank1_exception_gives_torchruns_exit_code(clean_env):
    script = str(SCRIPTS / "fail_rank1.py")
    ours = smartlaunch(["--strategy", "ddp", "--nproc-per-node", "2", script], clean_env)
    theirs = torchrun(["--nproc-per-node", "2", script], clean_env)
    assert theirs.returncode != 0
    assert ours.returncode == theirs.returncode, ours.stderr[-2000:]
    assert "boom in rank 1" in ours.stderr


def test_a_rendezvous_port_in_use_is_one_line_naming_the_fix(clean_env):
    """Two jobs on one node without --standalone meet at the same port: torchrun prints a
    traceback (torch 2.11 at its default 29500); smartlaunch names the port and the fix."""
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = smartlaunch(["--strategy", "ddp", "--nproc-per-node", "2", "--master-port", str(port),
                         str(EXAMPLES / "train.py"), "--steps", "2"], clean_env)
    assert r.returncode == 11, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    line = [x for x in r.stderr.splitlines() if "rendezvous" in x]
    assert len(line) == 1 and f"port {port} on this node is in use" in line[0], r.stderr[-2000:]
    assert "--standalone" in line[0] and "--master-port" in line[0]


def test_sigterm_while_the_rendezvous_store_never_answers_ends_the_launch(clean_env):
    """A second node waits for a first node's store that accepts and never answers: torch's
    agent is blocked in C++, where no Python handler runs. SIGTERM still ends smartlaunch
    (torchrun, with no handler of its own yet, dies of it), 143 and one line."""
    import signal
    import socket
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        port = mute.getsockname()[1]
        p = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", "--strategy", "ddp",
                              "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "static",
                              "--master-addr", "127.0.0.1", "--master-port", str(port),
                              "--nproc-per-node", "2", str(EXAMPLES / "train.py")],
                             cwd=clean_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        try:
            mute.settimeout(120)
            conn, _ = mute.accept()         # the agent's store client is waiting on us now
            p.send_signal(signal.SIGTERM)
            rc = p.wait(timeout=30)
            conn.close()
        finally:
            p.kill()
    err = p.stderr.read()
    assert rc == 143, err[-2000:]
    assert err.splitlines()[-1] == ("smartlaunch: got SIGTERM while torch's agent waited for the "
                                    "rendezvous (its store never answered); nothing was started "
                                    "(exit 143)"), err[-2000:]


def test_single_sets_torchruns_worker_contract(clean_env):
    out_ours, out_theirs = clean_env / "ours.json", clean_env / "theirs.json"
    script = str(SCRIPTS / "envdump.py")
    r = smartlaunch(["--strategy", "single", script, str(out_ours)], clean_env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert torchrun(["--nproc-per-node", "1", script, str(out_theirs)], clean_env).returncode == 0
    ours, theirs = json.loads(out_ours.read_text()), json.loads(out_theirs.read_text())
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "GROUP_RANK": "0", "ROLE_RANK": "0", "GROUP_WORLD_SIZE": "1",
                 "ROLE_WORLD_SIZE": "1", "ROLE_NAME": "default", "TORCHELASTIC_RESTART_COUNT": "0",
                 "TORCHELASTIC_MAX_RESTARTS": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}.items():
        assert ours[k] == v == theirs[k], k
    # Same variables as torchrun sets; only the agent store differs (there is no agent).
    assert set(ours) == set(theirs)
    assert ours["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert int(ours["MASTER_PORT"]) > 0 and ours["MASTER_ADDR"]
    assert ours["_world"] == 1


def test_single_returns_the_scripts_exit_code(clean_env):
    r = smartlaunch(["--strategy", "single", str(SCRIPTS / "envdump.py"),
                     str(clean_env / "o.json"), "7"], clean_env)
    assert r.returncode == 7


def test_single_narrows_cuda_visible_devices_to_the_chosen_gpu(clean_env):
    out = clean_env / "o.json"
    r = smartlaunch(["--strategy", "single", str(SCRIPTS / "envdump.py"), str(out)], clean_env,
                    {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair"),
                     "CUDA_VISIBLE_DEVICES": "1,0"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(out.read_text())["CUDA_VISIBLE_DEVICES"] in ("1", "0")


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_explain_prints_the_plan_and_never_starts_the_script(clean_env, fmt):
    marker = clean_env / "started"
    script = clean_env / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    r = smartlaunch([f"--explain={fmt}", "--strategy", "ddp", "--nproc-per-node", "2",
                     str(script)], clean_env,
                    {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")})
    assert r.returncode == 0, r.stderr[-2000:]
    assert not marker.exists()
    if fmt == "json":
        plan = json.loads(r.stdout)
        assert plan["schema_version"] == 1
        assert plan["strategy"] == "ddp" and plan["gpus"] == [0, 1]
        assert plan["nproc_per_node"] == 2 and plan["device"] == "cuda"
    else:
        assert "ddp" in r.stdout.lower() and "GPU" in r.stdout


def test_nproc_above_visible_gpus_is_a_usage_error(clean_env):
    (clean_env / "t.py").write_text("")
    r = smartlaunch(["--nproc-per-node", "4", "t.py"], clean_env,
                    {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")})
    assert r.returncode == 2, r.stderr
    assert len(own_lines(r.stderr)) == 1 and "--nproc-per-node 4" in r.stderr


def test_ddp_with_one_gpu_is_refused(clean_env):
    (clean_env / "t.py").write_text("")
    r = smartlaunch(["--strategy", "ddp", "t.py"], clean_env,
                    {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair"),
                     "CUDA_VISIBLE_DEVICES": "0"})
    assert r.returncode == 5, r.stderr
    assert len(own_lines(r.stderr)) == 1 and "ddp" in r.stderr


@pytest.mark.slow
def test_example_runs_unchanged_under_both_launchers(clean_env):
    args = [str(EXAMPLES / "train.py"), "--model", "large", "--steps", "2", "--warmup", "1",
            "--batch-size", "8"]
    assert torchrun(["--nproc-per-node", "2"] + args, clean_env).returncode == 0
    r = smartlaunch(args, clean_env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "params=6887178" in r.stdout


def test_sigkill_of_smartlaunch_takes_the_single_job_with_it(clean_env):
    import signal
    import time

    import psutil
    pidfile = clean_env / "child.pid"
    script = clean_env / "sleeper.py"
    script.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                      "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", "--strategy", "single",
                             str(script)], cwd=clean_env)
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    child = int(pidfile.read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the script outlived a SIGKILLed smartlaunch"
        time.sleep(0.1)


def test_sigterm_reaches_the_single_job_and_its_code_is_returned(clean_env):
    import signal
    import time
    ready = clean_env / "ready"
    script = clean_env / "graceful.py"
    script.write_text("import signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
                      f"open({str(ready)!r}, 'w').close()\n"
                      "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", "--strategy", "single",
                             str(script)], cwd=clean_env)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 42


def test_a_home_that_cannot_be_written_stops_nothing_when_the_cache_is_elsewhere(clean_env):
    """The run directories live under the cache directory (launch.log_dir's built-in): with
    HOME missing (or read-only) and SMARTLAUNCH_CACHE_DIR writable, a launch runs there."""
    cache = clean_env / "cache"
    r = smartlaunch(["--strategy", "single", str(EXAMPLES / "train.py"), "--steps", "3",
                     "--warmup", "1"], clean_env,
                    {"HOME": str(clean_env / "nohome"), "SMARTLAUNCH_CACHE_DIR": str(cache)})
    assert r.returncode == 0, r.stderr[-2000:]
    runs = list((cache / "logs").iterdir())
    assert len(runs) == 1 and (runs[0] / "summary.txt").is_file()
    assert not (clean_env / "nohome").exists()


def test_the_console_script_runs_a_module_of_the_current_directory(clean_env):
    # `smartlaunch -m train` as `torchrun -m train`: the ranks' `python -m` finds the module in
    # the current directory, so the launcher's check must look there too, not in its own
    # sys.path[0] (the console script's bin/ directory).
    exe = Path(sys.executable).with_name("smartlaunch")
    assert exe.exists(), f"the Quick start installs the console script: {exe} is missing"
    (clean_env / "mymod.py").write_text("import sys\nprint('mymod ran', sys.argv[1:])\n")
    (clean_env / "pkg").mkdir()
    (clean_env / "pkg" / "__init__.py").write_text("")
    (clean_env / "pkg" / "sub.py").write_text("print('pkg.sub ran')\n")
    for args, printed in ((["-m", "mymod", "a"], "mymod ran ['a']"),
                          (["-m", "pkg.sub"], "pkg.sub ran")):
        r = subprocess.run([str(exe), *args], cwd=clean_env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and printed in r.stdout, r.stderr[-2000:]


def test_the_console_script_started_with_stdout_closed_exits_as_the_job_did(clean_env):
    # `smartlaunch train.py >&-` (a cron job, a daemon's child): python gives such a process
    # sys.stdout = None; the launcher's last flush raised AttributeError, exit 1 after the job.
    exe = Path(sys.executable).with_name("smartlaunch")
    (clean_env / "job.py").write_text("open('ran', 'w').write('yes')\n")
    r = subprocess.run([str(exe), "--quiet", "job.py"], cwd=clean_env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=120,
                       preexec_fn=lambda: os.close(1))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert (clean_env / "ran").read_text() == "yes"


@pytest.mark.parametrize("args", [["--explain"], []])
def test_a_home_that_does_not_exist_costs_the_launch_its_cache_not_the_job(clean_env, args):
    # HOME=/nonexistent is a service account's (torchrun runs its jobs): the decision measures
    # without caching, the run files go to a private temp directory, and HOME is never made.
    home = clean_env / "nohome"
    r = smartlaunch([*args, str(EXAMPLES / "train.py"), "--steps", "3", "--warmup", "1"],
                    clean_env, {"HOME": str(home), "XDG_CACHE_HOME": "",
                                "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    said = [line for line in r.stderr.splitlines() if f"HOME={home} does not exist" in line]
    assert said and all(line.startswith("smartlaunch: ") for line in said), r.stderr[-2000:]
    if not args:
        assert "throughput: samples/s=" in r.stdout
        assert any("measuring without caching" in line for line in said), said
    assert not home.exists()


def test_explain_into_a_pipe_its_reader_closed_ends_quietly(clean_env):
    # `smartlaunch --explain train.py | head -1` where head has gone before the plan is
    # written: no traceback, the exit of a program SIGPIPE ended (128 + 13), as git's.
    p = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", "--explain",
                          str(EXAMPLES / "train.py")], cwd=clean_env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()                    # the reader goes before anything is written
    err = p.communicate(timeout=120)[1]
    assert p.returncode == 141, err[-2000:]
    assert "Traceback" not in err and "Error" not in err, err[-2000:]


ONCE = ("import os, sys\nc = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
        "print('attempt', c, flush=True)\nsys.exit(1 if c == 0 else 0)\n")


def test_a_single_process_honours_torchruns_log_and_restart_options(clean_env):
    # The decision on this machine is one process (no GPU). Where the command line asks for
    # what torch's agent does (--log-dir, --redirects, --tee, --max-restarts, --role, ...), the
    # process is run as torchrun --nproc-per-node 1 runs it, not bare.
    script = clean_env / "once.py"
    script.write_text(ONCE)
    ours = smartlaunch(["--max-restarts", "1", str(script)], clean_env)
    theirs = torchrun(["--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
                       str(script)], clean_env)
    assert theirs.returncode == 0 and "attempt 1" in theirs.stdout, theirs.stderr[-2000:]
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert "single process" in ours.stderr and "attempt 1" in ours.stdout, ours.stdout

    logs = clean_env / "logs"
    r = smartlaunch(["--log-dir", str(logs), "--redirects", "3", str(script)], clean_env)
    assert r.returncode == 1 and "attempt 0" not in r.stdout, r.stdout
    (out,) = logs.glob("*/attempt_0/0/stdout.log")
    assert out.read_text() == "attempt 0\n"

    role = clean_env / "role.py"
    role.write_text("import os\nprint('role', os.environ['ROLE_NAME'])\n")
    r = smartlaunch(["--role", "trainer", str(role)], clean_env)
    assert r.returncode == 0 and "role trainer" in r.stdout, r.stderr[-2000:]


WAITS_FOR_GO = """\
import os, sys, time
print("ready", flush=True)
while not os.path.exists(sys.argv[1] + ".go"):
    time.sleep(0.05)
open(sys.argv[1] + "-" + os.environ["RANK"], "w").write("finished")
"""


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_nohup_job_outlives_the_terminals_hangup(clean_env, ranks):
    # `nohup smartlaunch ... &`, then the terminal goes: SIGHUP to the launcher and its group.
    # python leaves an ignored SIGHUP ignored; torchrun (and smartlaunch) ended the job (exit
    # 1 / 129), pytorch/pytorch#76894.
    import signal
    script = clean_env / "waits.py"
    script.write_text(WAITS_FOR_GO)
    mark = clean_env / "done"
    force = ["--strategy", "ddp", "--nproc-per-node", "2"] if ranks == 2 else []
    p = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", *force, str(script),
                          str(mark)], cwd=clean_env, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        _wait_for(p, "ready", ranks)
        os.killpg(p.pid, signal.SIGHUP)
        p.send_signal(signal.SIGHUP)
        (clean_env / "done.go").touch()
        assert p.wait(timeout=60) == 0
    finally:
        p.kill()
        p.stdout.close()
    assert sorted(f.name for f in clean_env.glob("done-*")) == [f"done-{r}" for r in range(ranks)]


STEPS_UNTIL_GO = """\
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
def step():
    m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad(); time.sleep(0.01)
for _ in range(5):
    step()
print("stepping", flush=True)
while not os.path.exists(sys.argv[1]):
    step()
for _ in range(30):
    step()
print("finished", flush=True)
"""


def test_a_job_stopped_whole_and_resumed_is_not_a_hang(clean_env):
    # Ctrl-Z then fg, or a suspended Slurm job (SIGSTOP to every process, then SIGCONT): the
    # watchdog counted the stop as the ranks' idle time and ended the job as hung on resume.
    script = clean_env / "steps.py"
    script.write_text(STEPS_UNTIL_GO)
    (clean_env / "p.yaml").write_text("launch:\n  hang_timeout_s: 2\n  hang_step_multiple: 2\n")
    go = clean_env / "go"
    p = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", "--policy", "p.yaml",
                          "--strategy", "ddp", "--nproc-per-node", "2", str(script), str(go)],
                         cwd=clean_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        _wait_for(p, "stepping", 2)
        import psutil                         # every process of the job, as Slurm stops it
        job = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
        for q in job:
            q.suspend()
        time.sleep(4)                         # the stop itself: twice the hang limit
        go.touch()
        for q in job:
            q.resume()
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0 and "hang" not in err, err[-3000:]
    assert out.count("finished") == 2, out


RUNS_A_LAUNCH = """\
import os, subprocess, sys
print("outer", flush=True)
subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--quiet", sys.argv[1]], check=True)
"""


def test_a_launch_inside_a_rank_keeps_its_output_out_of_the_outer_ranks_log(clean_env):
    # A script that runs smartlaunch itself (an evaluation, a sweep driver): the inner workers
    # inherited the outer worker hook's variables and copied their output into the outer
    # rank's log as well (each line twice there), and its NUMA binding where it had one.
    (clean_env / "inner.py").write_text("print('inner', flush=True)\n")
    (clean_env / "outer.py").write_text(RUNS_A_LAUNCH)
    (clean_env / "p.yaml").write_text(f"launch:\n  log_dir: {clean_env / 'logs'}\n")
    r = smartlaunch(["--policy", "p.yaml", "--quiet", "--strategy", "ddp", "--nproc-per-node",
                     "1", "outer.py", "inner.py"], clean_env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["outer", "inner"], r.stdout
    outer, = (clean_env / "logs").glob("*/logs/0/stdout.log")     # the inner: one process
    assert outer.read_text() == "outer\ninner\n"


SAVES_ON_SIGTERM = """\
import os, signal, sys, time
def save(signum, frame):
    time.sleep(12)                  # a checkpoint that takes longer than 10 s to write
    open(sys.argv[1] + "-" + os.environ["RANK"], "w").write("saved")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("ready", flush=True)
time.sleep(300)
"""


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_checkpoint_saved_on_sigterm_is_kept_as_under_torchrun(clean_env, ranks):
    # Preemption sends SIGTERM; torchrun waits 30 s for the ranks before SIGKILL, and so does
    # smartlaunch (it waited 10 s: a 12 s checkpoint was cut off).
    import signal
    script = clean_env / "saves.py"
    script.write_text(SAVES_ON_SIGTERM)
    force = ["--strategy", "ddp", "--nproc-per-node", "2"] if ranks == 2 else []
    p = subprocess.Popen([sys.executable, "-m", "smartlaunch.cli", *force, str(script),
                          str(clean_env / "ckpt")], cwd=clean_env, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    try:
        _wait_for(p, "ready", ranks)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    finally:
        p.kill()
        p.stdout.close()
    assert sorted(f.name for f in clean_env.glob("ckpt-*")) == \
        [f"ckpt-{r}" for r in range(ranks)]


CRASH = ("import ctypes, os, signal, sys\n"
         "print('started', flush=True)\n"
         "if sys.argv[1] == 'segv':\n"
         "    ctypes.string_at(0)\n"
         "elif sys.argv[1] == 'kill':\n"
         "    os.kill(os.getpid(), signal.SIGKILL)\n"
         "raise KeyboardInterrupt\n")


@pytest.mark.parametrize("how,code", [("segv", 139), ("kill", 137), ("interrupt", 130)])
def test_a_script_a_signal_kills_is_said_as_a_shell_would(clean_env, how, code):
    """Under smartlaunch the shell sees an exit code, not a signal, and prints nothing
    ("Segmentation fault", "Killed"): smartlaunch says it, with the crash's Python stacks on a
    GPU (the worker hook's faulthandler file); a KeyboardInterrupt's traceback is enough."""
    script = clean_env / "crash.py"
    script.write_text(CRASH)
    for extra in ({}, {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")}):
        r = smartlaunch(["--strategy", "single", str(script), how], clean_env, extra)
        assert r.returncode == code, r.stderr[-2000:]
        said = [ln for ln in r.stderr.splitlines() if "was killed by" in ln]
        if how == "interrupt":
            assert not said and "KeyboardInterrupt" in r.stderr
            continue
        name = "SIGSEGV" if how == "segv" else "SIGKILL"
        assert len(said) == 1 and f"killed by {name} (exit {code})" in said[0], r.stderr
        if how == "segv" and extra:     # a GPU launch keeps stacks: the line names the file
            path = said[0].split("stacks at the crash: ")[1]
            assert "crash.py" in Path(path).read_text()
        else:
            assert "stacks" not in said[0]


def test_a_rank_that_crashes_names_its_python_stacks(clean_env):
    script = clean_env / "crash.py"
    script.write_text(CRASH)
    r = smartlaunch(["--strategy", "ddp", "--nproc-per-node", "2", str(script), "segv"],
                    clean_env, {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")})
    assert r.returncode != 0
    line = [ln for ln in r.stderr.splitlines() if "Python stacks at the crash" in ln]
    assert len(line) == 1, r.stderr[-3000:]
    assert "crash.py" in Path(line[0].split(": ", 1)[1]).read_text()


@pytest.mark.parametrize("value", ["cpu", "auto"])
def test_ddp_on_the_cpu_counts_cpu_and_auto_as_torchrun_does(clean_env, value):
    """torchrun --nproc-per-node cpu|auto on a machine without GPUs: one rank per CPU."""
    script = clean_env / "who.py"
    script.write_text("import os\nos.write(1, f\"world {os.environ['WORLD_SIZE']}\\n\".encode())\n")
    r = smartlaunch(["--strategy", "ddp", "--nproc-per-node", value, str(script)], clean_env)
    n = len(os.sched_getaffinity(0))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count(f"world {n}\n") == n, (r.stdout, r.stderr[-2000:])


def test_ddp_on_the_cpu_with_nproc_gpu_is_one_line(clean_env):
    (clean_env / "x.py").write_text("")
    r = smartlaunch(["--strategy", "ddp", "--nproc-per-node", "gpu", "x.py"], clean_env)
    assert r.returncode == 2
    assert own_lines(r.stderr) == ["smartlaunch: error: --nproc-per-node gpu on a node without "
                                   "GPUs (torchrun fails the same: CUDA is not available); give "
                                   "the number of processes per node, e.g. --nproc-per-node 1"]


ENV_FIRST = ("import os, sys\n"
             "print('torch before the script:', 'torch' in sys.modules, flush=True)\n"
             "os.environ['OMP_NUM_THREADS'] = '1'\n"
             "import torch\n"
             "m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
             "for _ in range(12):\n"
             "    m(torch.ones(1, 2)).sum().backward(); o.step(); o.zero_grad()\n"
             "print('threads', torch.get_num_threads(), flush=True)\n")


@pytest.mark.parametrize("args,extra", [
    (["--strategy", "single"], {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")}),
    (["--strategy", "ddp", "--nproc-per-node", "1"], {})])
def test_a_script_that_sets_its_environment_before_importing_torch_gets_it(clean_env, args,
                                                                            extra, monkeypatch):
    """The worker hook counted steps by importing torch before the script ran, so torch read
    OMP_NUM_THREADS before the script's own first lines set it (2 threads on 2 cores where
    python and torchrun give 1). Steps are still counted, once the script imports torch."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    script = clean_env / "env_first.py"
    script.write_text(ENV_FIRST)
    r = smartlaunch([*args, str(script)], clean_env, extra)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "torch before the script: False" in r.stdout and "threads 1" in r.stdout, r.stdout
    runs = sorted((clean_env / "home" / ".cache" / "smartlaunch" / "logs").glob(
        "*/progress/local0.bin"))
    from smartlaunch.launch.progress import read_progress
    assert read_progress(runs[-1]).steps == 12


def test_a_relative_lease_directory_is_refused_in_one_line(clean_env):
    """Resolved against each launch's directory, launches from two directories would lease
    the same GPU."""
    (clean_env / "who.py").write_text("print('ran')\n")
    r = smartlaunch(["--strategy", "single", "who.py"], clean_env,
                    {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair"),
                     "SMARTLAUNCH_LEASE_DIR": "leases-here"})
    assert r.returncode == 3 and "ran" not in r.stdout
    assert own_lines(r.stderr) == [
        "smartlaunch: error: lease directory 'leases-here' is a relative path: launches started "
        "in other directories would not see its leases; set paths.lease_dir (or "
        "SMARTLAUNCH_LEASE_DIR) to an absolute path"]
    assert not (clean_env / "leases-here").exists()


def test_a_scripts_help_through_a_cold_decision_runs_no_trial(clean_env):
    """`smartlaunch train.py --help` on GPUs: the dry run sees the script end before a step;
    trials of one and two GPUs (each a start-up) used to follow before the help text."""
    r = smartlaunch([str(EXAMPLES / "train.py"), "--help"], clean_env,
                    {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("usage:") == 1
    assert "trial" not in r.stderr and "single process on GPU0" in r.stderr, r.stderr


def test_a_failing_import_of_torch_shows_the_traceback_python_shows(clean_env):
    """The worker hook waits for the script's import of torch.optim.optimizer (it never imports
    torch first); when that import fails, the traceback is python's, with no frame of ours in
    the middle."""
    app = clean_env / "app"           # the script's folder: its torch shadows the real one
    pkg = app / "torch" / "optim"
    pkg.mkdir(parents=True)
    (app / "torch" / "__init__.py").write_text("import torch.optim\n")
    (pkg / "__init__.py").write_text("from . import optimizer\n")
    (pkg / "optimizer.py").write_text("raise ImportError('libcudart.so.13: cannot open it')\n")
    (app / "broken.py").write_text("import torch\n")
    theirs = subprocess.run([sys.executable, "app/broken.py"], cwd=clean_env,
                            capture_output=True, text=True)
    ours = smartlaunch(["--strategy", "single", "app/broken.py"], clean_env,
                       {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")})
    assert ours.returncode == theirs.returncode == 1
    tb = ours.stderr[ours.stderr.index("Traceback"):]
    assert tb == theirs.stderr and "libcudart" in tb


def test_a_script_that_found_nothing_to_do_is_measured_when_it_has_work(clean_env):
    """It ended in its dry run (no data yet, exit 0): that profile is not kept, so the next
    launch, with the data there, measures it."""
    script = clean_env / "waits_for_data.py"
    script.write_text("import os, sys\nif not os.path.exists('data.txt'):\n"
                      "    print('no data yet'); sys.exit(0)\n"
                      "import torch\nm = torch.nn.Linear(4, 1)\n"
                      "o = torch.optim.SGD(m.parameters(), lr=0.1)\nfor _ in range(40):\n"
                      "    m(torch.randn(8, 4)).sum().backward(); o.step(); o.zero_grad()\n")
    pair = {"SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")}
    first = smartlaunch(["--explain", str(script)], clean_env, pair)
    assert first.returncode == 0 and "nothing to measure" in first.stdout, first.stdout
    (clean_env / "data.txt").write_text("x")
    second = smartlaunch(["--explain", str(script)], clean_env, pair)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "nothing to measure" not in second.stdout and "[ok," in second.stdout, second.stdout
