"""The admin file is refused when a non-root user could rewrite it; the test-only switch that
stands in for /etc/smartlaunch/policy.yaml is honoured only under pytest, for the test user,
and never where a real admin policy exists."""
from __future__ import annotations

import os

import pytest

from smartlaunch.errors import PolicyError
from smartlaunch.policy import load
from smartlaunch.policy.load import check_admin_permissions, load_policy
from tests.helpers_policy import admin_environ, needs_no_system_admin_policy, write

pytestmark = needs_no_system_admin_policy
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
    policy = load_policy(environ=admin_environ(admin))
    assert policy.decision.max_gpus == 2 and policy.admin_path == admin


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o664])
def test_group_or_world_writable_admin_file_is_refused(admin, mode):
    os.chmod(admin, mode)
    with pytest.raises(PolicyError) as err:
        load_policy(environ=admin_environ(admin))
    assert str(err.value) == (
        f"admin policy file {admin} is group/world-writable (mode {mode:04o}), so a non-root "
        f"user could rewrite the admin rules; refusing it. Fix: sudo chmod go-w {admin}")


def test_writable_admin_directory_is_refused(admin):
    directory = os.path.dirname(admin)
    os.chmod(directory, 0o777)
    with pytest.raises(PolicyError) as err:
        load_policy(environ=admin_environ(admin))
    assert str(err.value) == (
        f"admin policy directory {directory} is group/world-writable (mode 0777), so a non-root "
        f"user could rewrite the admin rules; refusing it. Fix: sudo chmod go-w {directory}")


@as_root
def test_admin_file_owned_by_another_user_is_refused(admin):
    os.chown(admin, NOBODY, -1)
    with pytest.raises(PolicyError) as err:
        load_policy(environ=admin_environ(admin))
    assert str(err.value) == (
        f"admin policy file {admin} is owned by uid {NOBODY}, not root, so a non-root user "
        f"could rewrite the admin rules; refusing it. Fix: sudo chown root {admin}")


@as_root
def test_admin_directory_owned_by_another_user_is_refused(admin):
    directory = os.path.dirname(admin)
    os.chown(directory, NOBODY, -1)
    with pytest.raises(PolicyError, match=rf"admin policy directory .* is owned by uid {NOBODY}"):
        load_policy(environ=admin_environ(admin))


def test_symlinked_admin_file_is_checked_where_it_really_lives(admin, clean_env):
    open_dir = clean_env / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    target = write(open_dir, "real.yaml", RULES)
    os.chmod(target, 0o644)
    link = os.path.join(os.path.dirname(admin), "link.yaml")
    os.symlink(target, link)
    with pytest.raises(PolicyError, match=rf"admin policy directory {open_dir} is group/world-"):
        load_policy(environ=admin_environ(link))


def test_permission_check_trusts_only_the_given_uids(admin):
    check_admin_permissions(admin, {os.getuid()})
    with pytest.raises(PolicyError, match="is owned by uid"):
        check_admin_permissions(admin, {os.getuid() + 1})


@pytest.mark.parametrize("spoil", ["no pytest", "wrong uid", "no uid"])
def test_switch_is_ignored_outside_a_test_run(admin, spoil):
    environ = admin_environ(admin)
    if spoil == "no pytest":
        del environ["PYTEST_CURRENT_TEST"]
    elif spoil == "wrong uid":
        environ["SMARTLAUNCH_TEST_UID"] = str(os.getuid() + 1)
    else:
        del environ["SMARTLAUNCH_TEST_UID"]
    policy = load_policy(environ=environ)
    assert policy.admin_path is None and policy.decision.max_gpus is None


def test_switch_is_ignored_where_a_real_admin_policy_exists(admin, clean_env, monkeypatch):
    # Stand-in for /etc/smartlaunch/policy.yaml: the switch must not replace it (nor relax it).
    real = write(clean_env / "etc", "policy.yaml", "enforce:\n  decision: {max_gpus: 1}\n")
    os.chmod(real, 0o644)
    os.chmod(os.path.dirname(real), 0o755)
    monkeypatch.setattr(load, "ADMIN_POLICY_PATH", real)
    policy = load_policy(environ=admin_environ(admin))
    assert (policy.admin_path, policy.decision.max_gpus) == (real, 1)
    assert policy.source_of("decision.max_gpus") == f"enforced:{real}"


def test_real_admin_path_gets_the_permission_check_too(clean_env, monkeypatch):
    real = write(clean_env / "etc", "policy.yaml", RULES)
    os.chmod(os.path.dirname(real), 0o755)
    os.chmod(real, 0o666)
    monkeypatch.setattr(load, "ADMIN_POLICY_PATH", real)
    with pytest.raises(PolicyError, match="group/world-writable"):
        load_policy(environ=admin_environ())


def test_writable_ancestor_directory_is_refused_unless_sticky(clean_env):
    upper = clean_env / "upper"
    path = write(upper / "etc", "policy.yaml", RULES)
    os.chmod(path, 0o644)
    os.chmod(os.path.dirname(path), 0o755)
    upper.chmod(0o777)          # anyone could rename etc/ away and put their own in its place
    with pytest.raises(PolicyError, match=rf"admin policy directory {upper} is group/world-"):
        load_policy(environ=admin_environ(path))
    upper.chmod(0o1777)         # sticky, as /tmp: only etc/'s owner may rename it
    assert load_policy(environ=admin_environ(path)).decision.max_gpus == 2
