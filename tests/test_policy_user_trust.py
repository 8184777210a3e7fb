"""A user-layer policy file is trusted as git trusts a repository (safe.directory): only when the
user or root owns it and nobody else can write it, checked on the descriptor it is read from.
And an admin may limit which variables users' policy files set for the workers
(enforce.launch.user_env)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest

from helpers_common import REPO, own_lines
from helpers_nobody import AS_NOBODY, NOBODY, needs_nobody, needs_root, shared_tmp
from helpers_policy import as_admin_installed, load_with_admin, needs_admin_install, write
from smartlaunch.errors import ExitCode, PolicyError
from smartlaunch.policy.load import validate_file

PLANT = "launch: {env: {PYTHONPATH: \"%s\"}}\n"
SITECUSTOMIZE = "open(%r, 'w').write('ran as uid %%d' %% __import__('os').getuid())\n"


def _environ() -> dict:
    environ = dict(os.environ)
    environ.pop("SMARTLAUNCH_LEASE_DIR", None)
    return environ


def _load(cwd, user=None):
    return load_with_admin(None, user, environ=_environ(), cwd=str(cwd))


@pytest.fixture
def shared(clean_env):
    d = shared_tmp()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _plant(d, owner: int):
    """The reproduced attack: a policy whose launch.env puts the directory on PYTHONPATH, and a
    sitecustomize.py there that leaves a marker when any Python starts with it."""
    marker = d / "marker"
    (d / "sitecustomize.py").write_text(SITECUSTOMIZE % str(marker))
    (d / "smartlaunch.yaml").write_text(PLANT % f"{d}{os.pathsep}{REPO}")
    (d / "job.py").write_text("print('job ran')\n")
    for name in ("sitecustomize.py", "smartlaunch.yaml"):
        os.chown(d / name, owner, owner)
    return marker


def _launch(cwd) -> subprocess.CompletedProcess:
    # No PYTHONPATH of the user's own: it would win over the policy's (policy_env), and the
    # plant could not work even when read. The plant's own names this checkout after its dir.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "smartlaunch.cli", "--strategy", "single",
                           "job.py"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180)


@needs_root
def test_a_policy_planted_by_another_user_in_a_shared_dir_is_refused_and_runs_nothing(shared):
    marker = _plant(shared, NOBODY)
    r = _launch(shared)
    policy = shared / "smartlaunch.yaml"
    assert r.returncode == 3 and own_lines(r.stderr) == [
        f"smartlaunch: error: policy file {policy} is owned by uid {NOBODY} (nobody), not by you:"
        f" another user could make smartlaunch run code as you; refusing it. Fix: delete it, or "
        f"copy it to a file you own and pass --policy"], r.stderr
    assert "job ran" not in r.stdout and not marker.exists()


@needs_root
def test_the_same_policy_owned_by_the_user_is_read(shared):
    # The control of the test above: the plant works when the file is the user's own.
    marker = _plant(shared, os.geteuid())
    r = _launch(shared)
    assert r.returncode == 0 and "job ran" in r.stdout, r.stderr
    assert marker.read_text() == f"ran as uid {os.geteuid()}"


def test_an_own_0644_file_is_read(clean_env):
    path = write(clean_env, "smartlaunch.yaml", "decision: {trial_steps: 40}\n")
    os.chmod(path, 0o644)
    policy = _load(clean_env)
    assert policy.decision.trial_steps == 40 and policy.source_of("decision.trial_steps") == \
        f"user:{path}"


@pytest.mark.parametrize("mode", [0o664, 0o646])
def test_a_group_or_world_writable_own_file_is_refused(clean_env, mode):
    path = write(clean_env, "smartlaunch.yaml", "decision: {trial_steps: 40}\n")
    os.chmod(path, mode)
    with pytest.raises(PolicyError) as err:
        _load(clean_env)
    assert str(err.value) == (
        f"policy file {path} is group/world-writable (mode {mode:04o}): another user could make "
        f"smartlaunch run code as you; refusing it. Fix: chmod go-w {path}")
    assert err.value.exit_code == ExitCode.POLICY


def test_a_symlink_in_the_working_directory_is_refused_even_to_an_own_file(clean_env):
    target = write(clean_env / "mine", "p.yaml", "decision: {trial_steps: 40}\n")
    os.symlink(target, clean_env / "smartlaunch.yaml")
    with pytest.raises(PolicyError) as err:
        _load(clean_env)
    assert str(err.value) == (
        f"policy file {clean_env / 'smartlaunch.yaml'} is a symbolic link: smartlaunch follows no "
        f"link to the policy file it finds on its own, because another user could plant one; "
        f"refusing it. Fix: replace the link with the file it points to, or pass --policy "
        f"{target}")
    # Named with --policy, the link is the user's choice: followed, and the file it reaches
    # gets the owner and mode checks.
    assert _load(clean_env, str(clean_env / "smartlaunch.yaml")).decision.trial_steps == 40
    os.chmod(target, 0o666)
    with pytest.raises(PolicyError, match=r"is group/world-writable \(mode 0666\)"):
        _load(clean_env, str(clean_env / "smartlaunch.yaml"))


def test_a_dangling_symlink_is_refused_not_skipped(clean_env):
    home_file = write(clean_env / "home", ".config/smartlaunch/policy.yaml",
                      "decision: {trial_steps: 30}\n")
    assert _load(clean_env).source_of("decision.trial_steps") == f"user:{home_file}"
    os.symlink(clean_env / "nowhere.yaml", clean_env / "smartlaunch.yaml")
    with pytest.raises(PolicyError, match="is a symbolic link"):
        _load(clean_env)


def test_a_fifo_in_the_working_directory_is_refused_without_hanging(clean_env):
    os.mkfifo(clean_env / "smartlaunch.yaml")
    result = []
    t = threading.Thread(target=lambda: result.append(_try_load(clean_env)), daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():              # a blocked open: give it a writer so the thread can end
        with open(clean_env / "smartlaunch.yaml", "w"):
            pass
        pytest.fail("loading the policy blocked on a FIFO")
    assert result == [f"policy file {clean_env / 'smartlaunch.yaml'} is a FIFO, not a regular "
                      f"file; refusing it. Fix: name a .yaml file"]


def _try_load(cwd) -> str:
    try:
        _load(cwd)
    except PolicyError as exc:
        return str(exc)
    return "loaded"


@needs_root
def test_policy_given_with_option_owned_by_another_user_is_refused(clean_env):
    path = write(clean_env, "theirs.yaml", "decision: {trial_steps: 40}\n")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(PolicyError, match=rf"policy file {path} is owned by uid {NOBODY} "):
        _load(clean_env, path)


@needs_nobody
def test_a_root_owned_file_is_trusted_by_another_user(shared):
    path = write(shared, "site.yaml", "decision: {trial_steps: 40}\n")
    os.chmod(path, 0o644)
    (shared / "home").mkdir()
    os.chown(shared / "home", NOBODY, NOBODY)
    out = subprocess.run([*AS_NOBODY, sys.executable, "-m", "smartlaunch.node_cli", "policy",
                          "show", "--policy", path], cwd=shared / "home",
                         env={**os.environ, "HOME": str(shared / "home")},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"  trial_steps: 40  # user:{path}" in out.stdout.splitlines()


@needs_root
def test_policy_check_reads_anyones_file_and_says_a_launch_would_refuse_it(clean_env):
    path = write(clean_env, "theirs.yaml", "decision: {trial_steps: 40}\n")
    os.chown(path, NOBODY, NOBODY)
    assert validate_file(path).values["decision.trial_steps"] == 40
    out = subprocess.run([sys.executable, "-m", "smartlaunch.node_cli", "policy", "check", path],
                         cwd=clean_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"OK: {path}",
        f"note: a launch would refuse it as your policy file (--policy, ./smartlaunch.yaml): it "
        f"is owned by uid {NOBODY} (nobody), not by you: another user could make smartlaunch run "
        f"code as you; refusing it. Fix: delete it, or copy it to a file you own and pass "
        f"--policy"]


# ---- the admin's limit on the variables users' files set ---------------------------------

ADMIN = 'enforce:\n  launch:\n    user_env: ["NCCL_*", OMP_NUM_THREADS]\n'


def _with_admin(clean_env, user_text: str, admin_text: str = ADMIN):
    admin = write(clean_env, "admin.yaml", admin_text)
    user = write(clean_env, "user.yaml", user_text)
    return admin, user, lambda: load_with_admin(admin, user, environ=_environ())


def test_admin_allowlist_refuses_pythonpath_from_a_user_file(clean_env):
    admin, user, load = _with_admin(clean_env, "launch:\n  env:\n    NCCL_ALGO: Ring\n"
                                               "    PYTHONPATH: /tmp/x\n")
    with pytest.raises(PolicyError) as err:
        load()
    assert str(err.value) == (
        f"{user}:4: launch.env.PYTHONPATH: users' policy files may set only NCCL_*, "
        f"OMP_NUM_THREADS for the workers (the admin rule enforce.launch.user_env=[NCCL_*, "
        f"OMP_NUM_THREADS] in {admin}); remove PYTHONPATH from {user}")
    assert err.value.exit_code == ExitCode.POLICY


def test_admin_allowlist_accepts_what_it_names(clean_env):
    _, user, load = _with_admin(clean_env, "launch:\n  env: {NCCL_ALGO: Ring, OMP_NUM_THREADS: 4}\n"
                                           "  nccl: {PHB: {NCCL_PROTO: LL}}\n")
    policy = load()
    assert policy.launch.env == {"NCCL_ALGO": "Ring", "OMP_NUM_THREADS": "4"}
    assert policy.source_of("launch.env.NCCL_ALGO") == f"user:{user}"
    assert policy.launch.nccl["PHB"] == {"NCCL_PROTO": "LL"}


def test_admin_allowlist_covers_the_nccl_tables_too(clean_env):
    admin, user, load = _with_admin(clean_env, "launch:\n  nccl:\n    NV: {NCCL_NET_PLUGIN: evil}\n",
                                    'enforce:\n  launch:\n    user_env: [NCCL_ALGO]\n')
    with pytest.raises(PolicyError, match=rf"^{user}:3: launch.nccl.NV.NCCL_NET_PLUGIN: users' "
                                          rf"policy files may set only NCCL_ALGO "):
        load()


def test_an_empty_allowlist_allows_no_variable_and_no_rule_allows_any(clean_env):
    _, _, load = _with_admin(clean_env, "launch: {env: {OMP_NUM_THREADS: 2}}\n",
                             "enforce:\n  launch:\n    user_env: []\n")
    with pytest.raises(PolicyError, match=r"may set only no variable for the workers"):
        load()
    _, _, load = _with_admin(clean_env, "launch: {env: {PYTHONPATH: /x}}\n",
                             "enforce:\n  decision: {max_gpus: 2}\n")
    assert load().launch.env == {"PYTHONPATH": "/x"}


def test_the_admin_files_own_variables_are_not_limited(clean_env):
    _, _, load = _with_admin(clean_env, "decision: {trial_steps: 7}\n",
                             ADMIN + "launch:\n  env: {LD_LIBRARY_PATH: /opt/site}\n")
    assert load().launch.env == {"LD_LIBRARY_PATH": "/opt/site"}


@pytest.mark.parametrize("text, message", [
    ("launch:\n  user_env: [\"*\"]\n",
     "2: launch.user_env: holds the variables users' policy files may set in launch.env and "
     "launch.nccl: only the admin policy's enforce: section may set it; remove it (ask your "
     "administrator to change the rule)"),
    ("enforce:\n  launch:\n    user_env: NCCL_*\n",
     "3: enforce.launch.user_env: expected a list of variable names or patterns such as "
     "[\"NCCL_*\", OMP_NUM_THREADS], got str 'NCCL_*'"),
    ("enforce:\n  launch:\n    user_env: [\"NCCL_*\", \"A=B\"]\n",
     "3: enforce.launch.user_env[1]: str 'A=B' is not a variable name or pattern; use letters, "
     "digits, _ and the wildcards * ? [...], quoted (\"NCCL_*\")"),
])
def test_user_env_is_validated_and_only_an_admin_rule(tmp_path, text, message):
    from smartlaunch.policy.load import read_policy_file
    path = write(tmp_path, "p.yaml", text)
    with pytest.raises(PolicyError) as err:
        read_policy_file(path, allow_enforce="enforce" in text)
    assert str(err.value) == f"{path}:{message}"


def test_an_admin_file_sets_user_env_only_under_enforce(tmp_path):
    path = write(tmp_path, "admin.yaml", "launch:\n  user_env: [\"NCCL_*\"]\n")
    with pytest.raises(PolicyError, match=r":2: launch.user_env: .* section may set it; move it "
                                          r"under enforce:$"):
        validate_file(path)


@needs_admin_install
def test_a_launch_under_the_installed_rule_is_refused_in_one_line(clean_env):
    admin = write(clean_env, "admin.yaml", ADMIN)
    write(clean_env, "smartlaunch.yaml", "launch: {env: {PYTHONPATH: /tmp/x}}\n")
    (clean_env / "job.py").write_text("print('job ran')\n")
    r = subprocess.run(as_admin_installed([sys.executable, "-m", "smartlaunch.cli", "--strategy",
                                           "single", "job.py"], admin, clean_env / "ns"),
                       cwd=clean_env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 3 and "job ran" not in r.stdout
    assert own_lines(r.stderr) == [
        f"smartlaunch: error: {clean_env / 'smartlaunch.yaml'}:1: launch.env.PYTHONPATH: users' "
        f"policy files may set only NCCL_*, OMP_NUM_THREADS for the workers (the admin rule "
        f"enforce.launch.user_env=[NCCL_*, OMP_NUM_THREADS] in /etc/smartlaunch/policy.yaml); "
        f"remove PYTHONPATH from {clean_env / 'smartlaunch.yaml'}"]
    (clean_env / "elsewhere").mkdir()
    show = subprocess.run(as_admin_installed([sys.executable, "-m", "smartlaunch.node_cli",
                                              "policy", "show"], admin, clean_env / "ns2"),
                          cwd=clean_env / "elsewhere", capture_output=True, text=True,
                          timeout=120)
    assert show.returncode == 0, show.stderr
    assert "  # user_env: [NCCL_*, OMP_NUM_THREADS]  # enforced:/etc/smartlaunch/policy.yaml: " \
        "the variables users' policy files may set in launch.env and launch.nccl" \
        in show.stdout.splitlines()


def test_the_shipped_cluster_policy_allows_nccl_tuning_not_code_loading(clean_env):
    from helpers_policy import POLICIES
    admin = str(POLICIES / "shared-cluster.yaml")
    ok = write(clean_env, "ok.yaml", "launch:\n  env: {NCCL_ALGO: Ring, OMP_NUM_THREADS: 8}\n"
                                     "  nccl: {NV: {NCCL_MIN_NCHANNELS: 4}}\n")
    assert load_with_admin(admin, ok, environ=_environ()).launch.env["NCCL_ALGO"] == "Ring"
    for var in ("PYTHONPATH", "LD_PRELOAD", "NCCL_NET_PLUGIN"):
        bad = write(clean_env, "bad.yaml", f"launch:\n  env: {{{var}: /tmp/x}}\n")
        with pytest.raises(PolicyError, match=rf"launch.env.{var}: users' policy files may set "
                                              rf"only NCCL_ALGO, "):
            load_with_admin(admin, bad, environ=_environ())
