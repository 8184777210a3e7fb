"""The processes a cold decision starts: one Session owns them (profile/session.py), each rank
speaks over its own control socket (profile/control.py), and profile/early.py says what starts
with the dry run and when each may go. Real processes; gloo ranks on the CPU and a fake two-GPU
topology for the whole decisions."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from helpers_common import REPO, wait_until
from helpers_early import POLICY, cold_plan, private_tmp, tagged_left

from smartlaunch.profile import early
from smartlaunch.profile.early import DRY_RUN, Early, EarlyWork, what_to_start
from smartlaunch.profile.session import Session, State

pytestmark = pytest.mark.timeout(240)

# A measuring child in miniature: ARRIVE_S of set-up, its gate, three steps, "done", then what
# its go asks (linger seconds, exit code).
CHILD = """
import os, sys, time
from smartlaunch.profile.control import Control
c = Control.from_env()
time.sleep(float(os.environ.get("ARRIVE_S", "0")))
waited, opts = c.gate()
for k in (1, 2, 3):
    c.step(k, 3)
c.done()
time.sleep(float(opts.get("linger", 0)))
sys.exit(int(opts.get("code", 0)))
"""


def start(s: Session, role: str, **env):
    full = {**os.environ, "PYTHONPATH": str(REPO), **{k: str(v) for k, v in env.items()}}
    return s.start(role, [([sys.executable, "-c", CHILD], full, {})], gate=True)


# ---- what starts early: one pure function ------------------------------------------------
P, Q = (0, 1, 2, 3), (0, 1)


@pytest.mark.parametrize("kw, want", [
    ({}, EarlyWork(P, sweep=True, trials=(P, Q))),
    ({"dry_run": False}, None),                         # nothing measures: nothing starts
    ({"groups": []}, None),                             # no DDP candidate
    ({"cores": 2}, None),                               # CI's two cores: not one to spare
    ({"cores": 6}, EarlyWork(P, sweep=True, trials=())),       # the sweep first
    ({"cores": 8}, EarlyWork(P, sweep=True, trials=(Q,))),     # then what cores are left
    ({"cores": 7, "sweep_cached": True}, EarlyWork(P, sweep=False, trials=(P,))),
    ({"trial_wanted": [False, True]}, EarlyWork(P, sweep=True, trials=(Q,))),
    ({"sweep_cached": True, "trial_wanted": [False, False]}, None),
    ({"groups": [Q], "trial_wanted": [True]}, EarlyWork(Q, sweep=True, trials=(Q,))),
])
def test_what_starts_early_follows_from_plain_facts(kw, want):
    facts = {"dry_run": True, "groups": [P, Q], "cores": 16, "sweep_cached": False,
             "trial_wanted": [True, True], **kw}
    assert what_to_start(**facts) == want


# ---- the session: states, the go, the end -------------------------------------------------
def test_a_stage_goes_from_its_gate_to_done_and_is_killed_with_its_reason(clean_env):
    with Session() as s:
        st = start(s, "a trial")
        assert st.state == State.STARTED
        assert s.wait(lambda: st.state == State.AT_GATE, 60)
        s.go(st, linger=30)
        assert s.wait(lambda: st.state == State.DONE, 60)
        assert st.ranks[0].step == (3, 3)
        s.kill(st, "a test ended it")
        assert st.state == State.KILLED and st.why == "a test ended it"
        assert st.children[0].returncode is not None


def test_an_exit_is_seen_with_its_code(clean_env):
    with Session() as s:
        st = start(s, "a trial")
        assert s.wait(lambda: st.state == State.AT_GATE, 60)
        s.go(st, code=3)
        assert s.wait(lambda: st.over, 60)
        assert st.state == State.ENDED and st.code == 3


def test_a_closed_control_socket_at_the_gate_lets_the_child_go_on(clean_env):
    with Session() as s:
        st = start(s, "a trial")
        assert s.wait(lambda: st.state == State.AT_GATE, 60)
        s.sel.unregister(st.ranks[0].sock)
        st.ranks[0].sock.close()
        assert s.wait(lambda: st.over, 60) and st.code == 0


def test_closing_the_session_ends_what_runs_and_removes_its_dirs(clean_env, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    s = Session()
    st = start(s, "a trial", ARRIVE_S=60)
    d = s.tempdir("smartlaunch-test-")
    t0 = time.monotonic()
    s.close()
    assert time.monotonic() - t0 < 5
    assert st.children[0].returncode is not None and st.state == State.KILLED
    assert not os.path.exists(d) and list(tmp.iterdir()) == []
    wait_until(lambda: tagged_left() == [], what="the session's processes to end")


# ---- the rule: who may go when ------------------------------------------------------------
def early_with(s, *, trial_arrive_s=0.0, sweep=True, low_memory=lambda: False):
    trial = types.SimpleNamespace(stage=start(s, "a trial", ARRIVE_S=trial_arrive_s))
    sw = types.SimpleNamespace(stage=start(s, "the all-reduce benchmark"),
                               finish=lambda: None) if sweep else None
    e = Early(s, [trial], sw, sweep_limit_s=120, low_memory=low_memory)
    e.trial = trial
    return e


def test_the_sweep_measures_once_the_trial_is_set_up_and_the_dry_run_after_the_sweep(clean_env):
    with Session() as s:
        e = early_with(s, trial_arrive_s=1.0)
        dry = start(s, DRY_RUN)
        assert s.wait(lambda: dry.state != State.AT_GATE and dry.state != State.STARTED, 60)
        trial, sweep = e.trial.stage, e.sweep.stage
        assert trial.state == State.AT_GATE            # kept, set up, for the decision
        assert sweep.state == State.ENDED and sweep.code == 0
        assert trial.t_gate is not None and sweep.t_end >= trial.t_gate
        assert dry.t_gate is not None and dry.t_gate - dry.t_start < trial.t_gate - trial.t_start
        assert e.dropped == ""


def test_a_trial_slower_than_the_dry_runs_wait_is_killed_before_its_steps(clean_env,
                                                                          monkeypatch):
    monkeypatch.setattr(early, "READY_LIMIT_S", 1.0)
    with Session() as s:
        e = early_with(s, trial_arrive_s=60, sweep=False)
        dry = start(s, DRY_RUN)
        assert s.wait(lambda: dry.state == State.AT_GATE, 60)
        assert s.wait(lambda: dry.state not in (State.STARTED, State.AT_GATE), 60)
        waited = time.monotonic() - dry.t_gate
        assert 0.9 <= waited < 10
        assert e.trial.stage.state == State.KILLED
        assert e.dropped == "its set-up outlasted the dry run's wait"


def test_the_early_trial_is_killed_first_when_memory_runs_low(clean_env):
    low_at = time.monotonic() + 0.5
    with Session() as s:
        e = early_with(s, trial_arrive_s=60, sweep=False,
                       low_memory=lambda: time.monotonic() >= low_at)
        assert s.wait(lambda: e.trial.stage.over, 30)
        assert e.dropped == "host memory ran low" and time.monotonic() >= low_at


def test_memory_low_reads_the_share_left(clean_env):
    assert early.memory_low(1.0) and not early.memory_low(0.0)


# ---- the hooks' side --------------------------------------------------------------------
def test_a_gate_holds_the_first_forward_and_its_go_carries_the_step_count(tmp_path):
    import socket
    import torch
    from smartlaunch.profile.control import Control
    from smartlaunch.profile.dryrun import Recorder
    mine, theirs = socket.socketpair()
    rec = Recorder(str(tmp_path / "p.json"), warmup=1, measure=20, control=Control(theirs.detach()),
                   gate=True)
    time.sleep(0.2)                                    # the script's own set-up
    threading.Timer(0.5, lambda: mine.sendall(b'{"go": {"measure": 7}}\n')).start()
    rec.on_pre(torch.nn.Linear(4, 2), (torch.zeros(3, 4),))
    assert json.loads(mine.recv(100).split(b"\n")[0]) == {"gate": 1}
    assert rec.measure == 7 and rec.gate_wait_s >= 0.45
    rec.on_step()
    assert rec.result()["startup_s"] < 0.45            # the wait left out of the set-up
    mine.close()


def test_a_compiled_first_forward_compiles_before_the_gate_and_its_first_step_waits(tmp_path):
    """torch.compile's first call compiles (CPU work, tens of seconds on a GPU node) before it
    computes: the wait for the all-reduce sweep moves to the end of the first step."""
    import socket
    import torch
    from smartlaunch.profile.control import Control
    from smartlaunch.profile.dryrun import Recorder
    mine, theirs = socket.socketpair()
    rec = Recorder(str(tmp_path / "p.json"), warmup=1, measure=20, control=Control(theirs.detach()),
                   gate=True)
    model = torch.compile(torch.nn.Linear(4, 2))
    threading.Timer(0.5, lambda: mine.sendall(b'{"go": {"measure": 7}}\n')).start()
    rec.on_pre(model, (torch.zeros(3, 4),))           # the wrapper's call, before any compile
    rec.on_pre(torch.nn.Linear(4, 2), (torch.zeros(3, 4),))   # a graph break: run eagerly
    mine.setblocking(False)
    with pytest.raises(BlockingIOError):
        mine.recv(100)                                 # no gate yet
    mine.setblocking(True)
    rec.on_step()                                      # the first step's end: held here
    assert json.loads(mine.recv(100).split(b"\n")[0]) == {"gate": 1}
    assert rec.measure == 7 and rec.gate_wait_s >= 0.3 and rec.steps == 1
    mine.close()


def test_the_command_line_is_parsed_without_importing_torch(clean_env):
    code = ("import sys; from smartlaunch import cli; "
            "r, _ = cli.parse(['--nproc-per-node', '2', '--explain', 'examples/train.py', '--x']); "
            "print(r.max_gpus, r.script, r.script_args, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.stdout.split() == ["2", "examples/train.py", "('--x',)", "False"], out.stderr


def test_torchruns_parser_built_from_its_source_is_torchruns(clean_env):
    from torch.distributed.run import get_args_parser
    from smartlaunch.cli import _torchrun_parser_from_source

    def options(parser):
        return [(tuple(a.option_strings), a.dest, repr(a.default), a.nargs, repr(a.const),
                 tuple(a.choices or ()), getattr(a.type, "__name__", None), a.required, a.help,
                 type(a).__name__) for a in parser._actions]
    assert options(_torchrun_parser_from_source()) == options(get_args_parser())


# ---- whole cold decisions -----------------------------------------------------------------
SETUP = str(Path(__file__).resolve().parent / "scripts" / "decide" / "setup_stamps.py")
STAMPED = str(Path(__file__).resolve().parent / "scripts" / "stamped_train.py")
# A wide band around a low floor: the decision asks for the DDP trial for any prediction of
# 8-75% efficiency (at 0.5 a loaded CPU once predicted 16%, just outside the band).
TRIAL_POLICY = "decision:\n  min_efficiency: 0.25\n  uncertainty_band: 2.0\n  trial_steps: 3\n" \
               "dryrun:\n  warmup_steps: 1\n  measure_steps: 3\n"
# No trials: the sweep is the only early stage, and the dry run the only run of the script.
SWEEP_POLICY = "decision:\n  min_efficiency: 0.5\n  trials: false\n" \
               "dryrun:\n  warmup_steps: 1\n  measure_steps: 3\n"


def read(d: Path, name: str) -> dict:
    return json.loads((d / f"{name}.json").read_text())


def settled(tmp: Path) -> None:
    wait_until(lambda: tagged_left() == [] and list(tmp.iterdir()) == [],
               what="every process and temp dir of the decision to be gone")


@pytest.mark.slow
def test_the_trial_sets_itself_up_beside_the_dry_run_and_steps_when_asked(
        clean_env, shared_dir, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    plan, _, _ = cold_plan(clean_env, SETUP, TRIAL_POLICY, ENV_DUMP=str(shared_dir), SETUP_S="2")
    assert [c for c in plan.to_dict()["candidates"] if c.get("measured")], plan.to_json()
    dry, ranks = read(shared_dir, "dry0"), [read(shared_dir, f"trial{r}") for r in (0, 1)]
    for r in ranks:
        assert "--gate" in r["cmdline"]                     # the ranks started with the dry run
        assert r["set_up"] < dry["first_forward"]           # set up before the dry run stepped
        assert r["first_forward"] > dry["first_forward"]    # held until the decision asked
    # What the decision waited for: not the trial's 2 s set-up again, only its steps.
    assert plan.timings["trials_setup"] < 2.0 <= plan.timings["profile"]
    settled(tmp)


@pytest.mark.slow
def test_on_four_gpus_both_trial_sizes_set_up_beside_the_dry_run(clean_env, shared_dir,
                                                                monkeypatch):
    """DDP×4 and DDP×2: each trial's ranks set the script up beside the dry run and step when
    asked; none starts cold. Steps of 20 ms (a sleep) and a ±200% band around 50%: ×4, the
    model's pick, is tried first, and ×2, corrected by it, could still win at the band's edge,
    so decide asks for it too, after the larger one."""
    tmp = private_tmp(clean_env, monkeypatch)
    plan, _, _ = cold_plan(clean_env, SETUP, TRIAL_POLICY.replace("min_efficiency: 0.25",
                                                                  "min_efficiency: 0.5"),
                           fixture="nvswitch-8gpu", max_gpus=4, ENV_DUMP=str(shared_dir),
                           STEP_S="0.02")
    measured = sorted(len(c["gpus"]) for c in plan.to_dict()["candidates"] if c.get("measured")
                      and c["strategy"] == "ddp")
    assert measured == [2, 4], plan.to_dict()["reasons"]
    dry = read(shared_dir, "dry0")
    for world in (2, 4):
        for r in range(world):
            stamps = read(shared_dir, f"trial-w{world}-r{r}")
            assert "--gate" in stamps["cmdline"] and stamps["set_up"] < dry["first_forward"]
    assert plan.timings.get("trials_start", 0.0) < 0.5      # no trial paid a cold start
    settled(tmp)


@pytest.mark.slow
def test_a_dry_run_out_of_memory_beside_the_trial_runs_again_alone(clean_env, shared_dir,
                                                                   monkeypatch):
    import io
    from smartlaunch.statusline import StatusLine
    tmp = private_tmp(clean_env, monkeypatch)
    err = io.StringIO()
    plan, _, _ = cold_plan(clean_env, SETUP, TRIAL_POLICY, status=StatusLine(err, tty=False),
                           ENV_DUMP=str(shared_dir), OOM_ONCE="1")
    assert (shared_dir / "oom-once").exists() and (shared_dir / "dry0.json").exists()
    assert plan.to_dict()["profile"]["status"] == "ok"
    assert err.getvalue().count("ran out of GPU memory beside the trial set up with it; "
                                "running it again alone") == 1
    settled(tmp)


def test_without_a_trial_set_up_early_a_dry_run_out_of_memory_fails(clean_env, shared_dir,
                                                                    monkeypatch):
    from smartlaunch.errors import DryRunError
    tmp = private_tmp(clean_env, monkeypatch)
    with pytest.raises(DryRunError) as err:
        cold_plan(clean_env, SETUP, TRIAL_POLICY.replace("trial_steps: 3\n", "trials: false\n"),
                  ENV_DUMP=str(shared_dir), OOM_ONCE="now")
    assert err.value.out_of_memory
    settled(tmp)


@pytest.mark.slow
def test_a_trial_set_up_early_that_the_decision_never_asks_for_is_killed(
        clean_env, shared_dir, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    # No band: the model's prediction decides and no trial is run.
    plan, _, _ = cold_plan(clean_env, SETUP, TRIAL_POLICY.replace("uncertainty_band: 2.0",
                                                                  "uncertainty_band: 0.0"),
                           ENV_DUMP=str(shared_dir))
    assert not [c for c in plan.to_dict()["candidates"] if c.get("measured")], plan.to_json()
    assert (shared_dir / "started0").exists()            # its ranks had started the script
    assert not (shared_dir / "trial0.json").exists()     # and never passed their gate
    settled(tmp)


def test_the_early_sweep_is_cached_and_the_decision_uses_it_without_a_second_benchmark(
        clean_env, shared_dir, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    from smartlaunch.decide.explain import render_text
    from smartlaunch.profile import comm
    from smartlaunch.strategies import REGISTRY
    started, real = [], comm.start_ranks

    def spy(session, module, gpus, *a, gate=False, **kw):
        started.append((tuple(gpus), gate))
        return real(session, module, gpus, *a, gate=gate, **kw)
    monkeypatch.setattr(comm, "start_ranks", spy)
    plan, topology, policy = cold_plan(clean_env, STAMPED, SWEEP_POLICY, STAMPS=str(shared_dir))
    assert started == [((0, 1), True)]                   # one benchmark: the early one
    assert plan.comm is not None and not plan.comm.cached and plan.comm.gpus == (0, 1)
    from smartlaunch.profile.cache import comm_key, load_comm
    hit = load_comm(policy, comm_key(topology, (0, 1), "gloo", os.environ), os.environ,
                    need_bytes=comm.CPU_SIZES[-1])
    assert hit is not None and [p[0] for p in hit.points] == list(comm.CPU_SIZES)
    seen = json.loads((shared_dir / "stamps.json").read_text())
    assert "--gate" in seen["cmdline"]
    assert plan.profile.gate_wait_s is not None and plan.timings["allreduce_early"] > 0
    assert "swept during the dry run in" in render_text(plan, REGISTRY)
    settled(tmp)


def test_prestart_false_or_two_cores_start_nothing_early(clean_env, shared_dir, monkeypatch):
    tmp = private_tmp(clean_env, monkeypatch)
    plan, _, _ = cold_plan(clean_env, STAMPED, SWEEP_POLICY, cores=2, STAMPS=str(shared_dir))
    assert "--gate" not in json.loads((shared_dir / "stamps.json").read_text())["cmdline"]
    assert plan.profile.gate_wait_s is None and "allreduce_early" not in plan.timings
    assert plan.comm is not None and not plan.comm.cached     # measured after the dry run
    settled(tmp)
    policy = SWEEP_POLICY.replace("trials: false\n", "trials: false\n  prestart: false\n")
    plan, _, _ = cold_plan(clean_env, STAMPED, policy, STAMPS=str(shared_dir),
                           XDG_CACHE_HOME=str(clean_env / "another-cache"))   # nothing cached
    assert "--gate" not in json.loads((shared_dir / "stamps.json").read_text())["cmdline"]
    settled(tmp)


def test_a_dry_run_failing_before_its_first_forward_leaves_nothing(clean_env, shared_dir,
                                                                  monkeypatch):
    from smartlaunch.errors import DryRunError
    tmp = private_tmp(clean_env, monkeypatch)
    with pytest.raises(DryRunError):
        cold_plan(clean_env, STAMPED, POLICY, STAMPS=str(shared_dir), FAIL_AT_SETUP="1")
    settled(tmp)


def test_a_launch_imports_torchs_launcher_once_its_dry_run_is_running(clean_env, shared_dir,
                                                                       monkeypatch):
    """The launcher's own `import torch` (~3 s on a GPU node) waits until the session first
    serves its processes, so it overlaps the dry run instead of delaying it."""
    import sys
    from smartlaunch.driver import Driver
    from smartlaunch.pipeline import make_plan
    from smartlaunch.request import Request
    roles, real = [], Driver._import_torch_once

    def spy(self):
        roles.append([s.role for s in self.session.stages])
        real(self)
    monkeypatch.setattr(Driver, "_import_torch_once", spy)
    policy = clean_env / "policy.yaml"
    policy.write_text(SWEEP_POLICY)
    environ = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": str(REPO / "smartlaunch" / "topology"
                                                              / "fixtures" / "h200-nv18-pair.json"),
               "STAMPS": str(shared_dir)}
    make_plan(Request(script=STAMPED, policy_path=str(policy)), set(), environ, cores=2)
    assert roles and DRY_RUN in roles[0]
    assert "torch.distributed.run" in sys.modules
