"""The admin file is refused when a non-root user could rewrite it, and nothing but the fixed
path /etc/smartlaunch/policy.yaml is ever read as the admin file (checked with the file
installed there, in a private mount namespace)."""
from __future__ import annotations

import os

import pytest

from smartlaunch.errors import PolicyError
import subprocess
import sys

from smartlaunch.policy.load import check_admin_permissions
from helpers_policy import as_admin_installed, load_with_admin, needs_admin_install, write
from helpers_common import own_lines
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
NOBODY = 65534
RULES = "enforce:\n  decision: {max_gpus: 2}\n"


@pytest.fixture
def admin(clean_env):
    directory = clean_env / "etc smartlaunch"      # a space: paths are quoted nowhere
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    path = write(directory, "policy.yaml", RULES)
    os.chmod(path, 0o644)
    return path


def test_a_properly_owned_admin_file_is_read(admin):
    policy = load_with_admin(admin)
    assert policy.decision.max_gpus == 2 and policy.admin_path == admin


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o664])
def test_group_or_world_writable_admin_file_is_refused(admin, mode):
    os.chmod(admin, mode)
    with pytest.raises(PolicyError) as err:
        load_with_admin(admin)
    assert str(err.value) == (
        f"admin policy file {admin} is group/world-writable (mode {mode:04o}), so a non-root "
        f"user could rewrite the admin rules; refusing it. Fix: sudo chmod go-w {admin}")


def test_writable_admin_directory_is_refused(admin):
    directory = os.path.dirname(admin)
    os.chmod(directory, 0o777)
    with pytest.raises(PolicyError) as err:
        load_with_admin(admin)
    assert str(err.value) == (
        f"admin policy directory {directory} is group/world-writable (mode 0777), so a non-root "
        f"user could rewrite the admin rules; refusing it. Fix: sudo chmod go-w {directory}")


@as_root
def test_admin_file_owned_by_another_user_is_refused(admin):
    os.chown(admin, NOBODY, -1)
    with pytest.raises(PolicyError) as err:
        load_with_admin(admin)
    assert str(err.value) == (
        f"admin policy file {admin} is owned by uid {NOBODY}, not root, so a non-root user "
        f"could rewrite the admin rules; refusing it. Fix: sudo chown root {admin}")


@as_root
def test_admin_directory_owned_by_another_user_is_refused(admin):
    directory = os.path.dirname(admin)
    os.chown(directory, NOBODY, -1)
    with pytest.raises(PolicyError, match=rf"admin policy directory .* is owned by uid {NOBODY}"):
        load_with_admin(admin)


def test_symlinked_admin_file_is_checked_where_it_really_lives(admin, clean_env):
    open_dir = clean_env / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    target = write(open_dir, "real.yaml", RULES)
    os.chmod(target, 0o644)
    link = os.path.join(os.path.dirname(admin), "link.yaml")
    os.symlink(target, link)
    with pytest.raises(PolicyError, match=rf"admin policy directory {open_dir} is group/world-"):
        load_with_admin(link)


def test_permission_check_trusts_only_the_given_uids(admin):
    check_admin_permissions(admin, {os.getuid()})
    with pytest.raises(PolicyError, match="is owned by uid"):
        check_admin_permissions(admin, {os.getuid() + 1})


def node_show(argv_prefix, cwd, env=None):
    return subprocess.run([*argv_prefix, sys.executable, "-m", "smartlaunch.node_cli", "policy",
                           "show"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@needs_admin_install
def test_the_installed_admin_file_is_read_and_the_environment_cannot_name_another(admin, clean_env):
    # The variables that once named a test admin file, and a user file that tries to relax.
    write(clean_env, "smartlaunch.yaml", "decision: {max_gpus: 8}\n")
    env = dict(os.environ, SMARTLAUNCH_TEST_ADMIN_POLICY=str(clean_env / "none.yaml"),
               SMARTLAUNCH_TEST_UID=str(os.getuid()), PYTEST_CURRENT_TEST="x")
    out = node_show(as_admin_installed([], admin, clean_env / "ns"), clean_env, env)
    assert out.returncode == 0, out.stderr
    assert "  max_gpus: 2  # enforced:/etc/smartlaunch/policy.yaml  (user:" in out.stdout
    assert not os.path.exists("/etc/smartlaunch/policy.yaml") or \
        open("/etc/smartlaunch/policy.yaml").read() != RULES     # nothing leaked out


@needs_admin_install
def test_the_installed_admin_file_gets_the_permission_check(admin, clean_env):
    out = node_show(as_admin_installed([], admin, clean_env / "ns", mode="0666"), clean_env)
    assert out.returncode == 3
    assert own_lines(out.stderr) == [
        "smartlaunch-node: error: admin policy file /etc/smartlaunch/policy.yaml is "
        "group/world-writable (mode 0666), so a non-root user could rewrite the admin rules; "
        "refusing it. Fix: sudo chmod go-w /etc/smartlaunch/policy.yaml"]


def test_writable_ancestor_directory_is_refused_unless_sticky(clean_env):
    upper = clean_env / "upper"
    path = write(upper / "etc", "policy.yaml", RULES)
    os.chmod(path, 0o644)
    os.chmod(os.path.dirname(path), 0o755)
    upper.chmod(0o777)          # anyone could rename etc/ away and put their own in its place
    with pytest.raises(PolicyError, match=rf"admin policy directory {upper} is group/world-"):
        load_with_admin(path)
    upper.chmod(0o1777)         # sticky, as /tmp: only etc/'s owner may rename it
    assert load_with_admin(path).decision.max_gpus == 2
