"""Dry runs of real, unchanged scripts on the CPU: counts, batch size, times, failure cases."""
from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import smartlaunch
from helpers_common import fixture_path, wait_until
from helpers_profile import GPT_ARGS, SCRIPTS, counts, gpt_expected, gpt_workdir, load
from smartlaunch.errors import DryRunError, ExitCode
from smartlaunch.policy.api import DryRunPolicy, Policy
from smartlaunch.profile.api import ProfileStatus
from smartlaunch.profile.runner import run_dry_run
from smartlaunch.request import Request

pytestmark = pytest.mark.timeout(120)

POLICY = Policy(dryrun=DryRunPolicy(time_limit_s=60, warmup_steps=1, measure_steps=3,
                                   measure_seconds=0.0))


def dry(script, *args, module=False, environ=None, policy=POLICY, progress=None):
    env = dict(os.environ if environ is None else environ)
    req = Request(script=str(script), script_args=tuple(args), module=module)
    return run_dry_run(req, policy, gpu=None, environ=env, progress=progress)


def assert_measured(prof, expected, batch):
    params, grad_bytes = expected
    assert prof.status == ProfileStatus.OK, prof.note
    assert (prof.trainable_params, prof.grad_bytes) == (params, grad_bytes)
    assert prof.batch_size == batch
    assert prof.steps_measured == POLICY.dryrun.measure_steps
    assert prof.step_time_p90_s >= prof.step_time_s > 0
    assert prof.startup_s > 0 and prof.dry_run_s > prof.startup_s
    assert prof.peak_host_mem_bytes > 10 << 20
    assert prof.device == "cpu"


def test_plain_script_with_worker_processes_leaves_none_behind(clean_env, shared_dir):
    pid_dir = shared_dir
    mod = load(SCRIPTS / "tiny_train.py", "tiny_train_for_tests")
    prof = dry(SCRIPTS / "tiny_train.py", "--batch-size", "8", "--width", "48", "--workers", "2",
               "--pid-dir", str(pid_dir))
    assert_measured(prof, counts(mod.build_model(48)), batch=8)
    assert prof.total_params == prof.trainable_params
    assert prof.param_dtypes == {"float32": prof.total_params}
    assert prof.num_grad_tensors == 6 and prof.wrapped is None
    workers = [int(p.name) for p in pid_dir.iterdir()]
    assert len(workers) == 2
    wait_until(lambda: not [p for p in workers if _alive(p)],
               what="the DataLoader workers to end with the dry run")
    assert "script output:" in prof.note and os.path.exists(prof.note.split("script output: ")[1][:-1])


def test_short_steps_measure_until_the_window_is_long_enough(clean_env):
    # 1.5 s: three steps of a tiny CPU model stay short of it even on a loaded machine
    policy = Policy(dryrun=DryRunPolicy(time_limit_s=60, warmup_steps=1, measure_steps=3,
                                        measure_seconds=1.5))
    seen = []
    prof = dry(SCRIPTS / "tiny_train.py", "--batch-size", "8", "--width", "48", policy=policy,
               progress=lambda k, n: seen.append((k, n)))
    assert prof.status == ProfileStatus.OK, prof.note
    assert prof.steps_measured > 3                      # a tiny CPU step is far below 1.5 s / 3
    assert prof.steps_measured * prof.step_time_s >= 1.5 * 0.9
    # The status line's "dry run step k of n": from the first step on it counts up, the goal
    # starts at warm-up + first step + measure_steps, grows with the seconds still wanted,
    # and ends on the total.
    total = 1 + 1 + prof.steps_measured
    assert seen and [k for k, _ in seen] == sorted(k for k, _ in seen), seen
    assert all(1 <= k <= total for k, _ in seen) and seen[-1] == (total, total), seen
    assert min(n for _, n in seen) >= 1 + 1 + 3


def test_frozen_layers_count_as_params_but_not_gradients(clean_env):
    mod = load(SCRIPTS / "frozen.py", "frozen_for_tests")
    model = mod.build_model()
    prof = dry(SCRIPTS / "frozen.py")
    assert_measured(prof, counts(model), batch=24)
    assert prof.total_params == counts(model, trainable_only=False)[0] > prof.trainable_params
    assert prof.backward_s is not None and prof.forward_s is not None


def test_a_script_given_a_real_gpu_that_runs_on_the_cpu_is_not_a_gpu_profile(clean_env):
    # No CUDA here: the script falls back to the CPU as it would where the driver is hidden.
    req = Request(script=str(SCRIPTS / "frozen.py"))
    prof = run_dry_run(req, POLICY, gpu="0", environ=dict(os.environ), real_gpu=True)
    assert prof.status == ProfileStatus.UNMEASURABLE and not prof.usable
    assert "given GPU 0 but the script ran on the CPU" in prof.note, prof.note
    # A fixture's GPU (tests, CPU machines) is not a finding: the CPU profile stands.
    assert run_dry_run(req, POLICY, gpu="0", environ=dict(os.environ)).status == ProfileStatus.OK


def test_package_run_with_dash_m(clean_env):
    sys.path.insert(0, str(SCRIPTS))
    try:
        from pkg_train.model import build_model
    finally:
        sys.path.remove(str(SCRIPTS))
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS))
    prof = dry("pkg_train", "--batch-size", "5", module=True, environ=env)
    assert_measured(prof, counts(build_model()), batch=5)


@pytest.mark.slow
def test_resnet_training_script(clean_env):
    mod = load(SCRIPTS / "resnet_train.py", "resnet_train_for_tests")
    prof = dry(SCRIPTS / "resnet_train.py", "--batch-size", "2", "--image-size", "32",
               "--num-classes", "10")
    assert_measured(prof, counts(mod.build_model(10)), batch=2)


def test_cuda_only_snapshot_job_unchanged(clean_env):
    # snapshot_ddp/train.py calls torch.cuda.set_device and NCCL unconditionally: CPU shim.
    mod = load(SCRIPTS / "snapshot_ddp" / "train.py", "snapshot_ddp_for_tests")
    _, model, _ = mod.load_train_objs()
    env = dict(os.environ, SMARTLAUNCH_DRYRUN_CPU_SHIM="1")
    prof = dry(SCRIPTS / "snapshot_ddp" / "train.py", "2", "1", "--batch_size", "8",
               environ=env)
    assert_measured(prof, counts(model), batch=8)
    assert prof.wrapped == "DDP"
    assert not (clean_env / "snapshot.pt").exists()      # the dry run's snapshot is not kept


def test_configured_gpt_trainer_unchanged(clean_env, monkeypatch):
    work = gpt_workdir(clean_env)
    monkeypatch.chdir(work)  # train.py execs configurator.py and reads data/ from its cwd
    prof = dry(work / "train.py", *GPT_ARGS)
    assert_measured(prof, gpt_expected(), batch=8)      # 2 micro-batches of 4 per step
    assert (prof.micro_batch_size, prof.micro_batches) == (4, 2)
    assert prof.wrapped == "DDP"  # torchrun's RANK makes the trainer wrap itself


def test_cuda_only_script_without_shim_crashes_and_is_not_launched(clean_env):
    with pytest.raises(DryRunError) as err:
        dry(SCRIPTS / "snapshot_ddp" / "train.py", "2", "1")
    assert err.value.exit_code == ExitCode.DRY_RUN
    assert "exit code 1" in str(err.value)


def test_no_optimizer_gets_a_clear_note_and_marker_opt_in_works(clean_env):
    prof = dry(SCRIPTS / "no_optimizer.py")
    assert prof.status == ProfileStatus.ENDED and not prof.usable
    assert "without building a torch optimizer" in prof.note and prof.step_time_s is None
    mod = load(SCRIPTS / "no_optimizer.py", "no_optimizer_for_tests")
    marked = dry(SCRIPTS / "no_optimizer.py", "--mark")
    assert_measured(marked, counts(mod.build_model()), batch=8)


def test_crash_reports_exit_code_and_stderr_once(clean_env, capfd):
    with pytest.raises(DryRunError) as err:
        dry(SCRIPTS / "crash.py")
    msg = str(err.value)
    assert "exit code 3" in msg and "was not launched" in msg
    # echoed live, so the error points at it instead of repeating it; the log has it all
    assert capfd.readouterr().err.count("learning rate must be positive") == 1
    assert "learning rate" not in msg and "its error output is above" in msg
    log = Path(msg.split("all of its output: ")[1].split(")")[0])
    lines = log.read_text().splitlines()         # stdout and stderr, in the order written
    assert lines.index("loading config") < \
        lines.index("error: learning rate must be positive (got -0.1)")


def test_crash_keeps_the_stderr_tail_where_it_was_not_echoed(clean_env, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())     # no byte stream to echo to
    with pytest.raises(DryRunError) as err:
        dry(SCRIPTS / "crash.py")
    assert "learning rate must be positive" in str(err.value)
    assert sys.stderr.getvalue() == ""


def test_a_raising_script_shows_its_traceback_once(clean_env):
    (clean_env / "boom.py").write_text("import torch\n\ndef main():\n"
                                       "    raise ValueError('bad shape 3x4')\n\nmain()\n")
    env = {**os.environ, "SMARTLAUNCH_FAKE_TOPOLOGY": fixture_path("h200-nv18-pair")}
    r = subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--nproc-per-node", "2",
                        "boom.py"], cwd=clean_env, env=env, capture_output=True, text=True,
                       timeout=100)
    assert r.returncode == ExitCode.DRY_RUN, r.stderr
    assert r.stderr.count("Traceback (most recent call last)") == 1, r.stderr
    assert r.stderr.count("ValueError: bad shape 3x4") == 1, r.stderr
    error = [x for x in r.stderr.splitlines() if x.startswith("smartlaunch: error:")]
    assert len(error) == 1 and "its error output is above" in error[0], r.stderr
    assert r.stderr.rstrip().endswith(error[0]), r.stderr     # nothing repeated after it


def test_time_limit_ends_a_script_that_never_steps(clean_env):
    policy = Policy(dryrun=DryRunPolicy(time_limit_s=3, warmup_steps=1, measure_steps=3))
    t0 = time.monotonic()
    prof = dry(SCRIPTS / "sleeper.py", policy=policy)
    assert time.monotonic() - t0 < 3 + 6
    assert prof.status == ProfileStatus.NO_STEP
    assert "no training step seen within 3 s" in prof.note


def test_no_python_is_skipped_without_running(clean_env):
    marker = clean_env / "ran"
    req = Request(script="touch", script_args=(str(marker),), no_python=True)
    prof = run_dry_run(req, POLICY, gpu=None, environ=dict(os.environ))
    assert prof.status == ProfileStatus.SKIPPED and "--no-python" in prof.note
    assert not marker.exists()


def test_profile_step_is_a_no_op_outside_the_dry_run():
    assert smartlaunch._step_hook is None
    assert smartlaunch.profile_step() is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


ENV_FIRST = """import os, sys
out = sys.argv[1]
world = int(os.environ["WORLD_SIZE"]) if sys.argv[2] == "world" else 1
os.environ["OMP_NUM_THREADS"] = "1"
import torch
with open(out, "w") as f:
    f.write(str(torch.get_num_threads()))
m = torch.nn.Linear(4, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(8):
    m(torch.randn(8, 4)).sum().backward(); o.step(); o.zero_grad()
"""


def test_the_dry_run_lets_the_script_set_its_environment_before_torch(clean_env, shared_dir):
    """The dry run and the trials hook torch once the script imports it: a script that sets
    OMP_NUM_THREADS first is measured with it, as the launch runs it (the dry run used to
    import torch before the script: 2 threads on 2 cores). A read of WORLD_SIZE before that
    import is still seen."""
    script = clean_env / "env_first.py"
    script.write_text(ENV_FIRST)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["WORLD_SIZE"] = "1"
    prof = dry(script, str(shared_dir / "threads"), "world", environ=env)
    assert prof.status == ProfileStatus.OK, prof.note
    assert (shared_dir / "threads").read_text() == "1"
    assert prof.reads_world_size == "env_first.py:3 (reads WORLD_SIZE)"
    assert prof.startup_s > 0


def test_a_script_that_never_imports_torch_ended_with_nothing_measured(clean_env):
    script = clean_env / "plain.py"
    script.write_text("import sys\nprint('no torch here:', 'torch' not in sys.modules)\n")
    prof = dry(script)
    assert prof.status == ProfileStatus.ENDED and "without building" in prof.note


def test_a_script_that_looks_torch_up_before_importing_it_is_measured(clean_env):
    """transformers' is_torch_available() asks importlib.util.find_spec("torch") first."""
    script = clean_env / "looks_first.py"
    script.write_text("import importlib.util\nassert importlib.util.find_spec('torch')\n"
                      + ENV_FIRST.replace("out = sys.argv[1]", "out = os.devnull"))
    prof = dry(script, "-", "-")
    assert prof.status == ProfileStatus.OK, prof.note


@pytest.mark.parametrize("torch_first", [True, False])
def test_a_script_that_exits_at_one_rank_after_reading_the_world_size_may_get_trials(clean_env,
                                                                                    torch_first):
    """It needs two ranks (exits 0 at one): the dry run cannot say a trial would end the same,
    so the profile is no_step (trials), not ended."""
    script = clean_env / "needs_two.py"
    script.write_text(("import torch\n" if torch_first else "") +
                      "import os, sys\nif int(os.environ['WORLD_SIZE']) < 2:\n"
                      "    print('needs 2 ranks')\n    sys.exit(0)\n")
    prof = dry(script, environ={**os.environ, "WORLD_SIZE": "1"})
    assert prof.status == ProfileStatus.NO_STEP, prof.note
    assert "it read the world size first (needs_two.py:" in prof.note
