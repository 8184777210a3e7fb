"""Helpers for the policy tests: policy files in tmp dirs, and the admin file installed where
an admin installs it.

Production code has no switch naming another admin file. Tests reach the admin layer two ways:
- in process, `load_with_admin(path)` passes the path (and the test user as an allowed owner)
  to load_policy, the parameters every command leaves at their defaults;
- as real commands, `as_admin_installed(argv, file)` runs argv in a private mount namespace
  where /etc is an overlay of the real /etc with the file installed at
  /etc/smartlaunch/policy.yaml by `install -o root -m MODE`, exactly as the README tells
  admins. Nothing outside the namespace sees it. Needs root and unshare (CI runs as root).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from smartlaunch.policy.load import ADMIN_POLICY_PATH, load_policy

REPO = Path(__file__).resolve().parent.parent
POLICIES = REPO / "smartlaunch" / "policy" / "shipped"


def write(directory: Path | str, name: str, text: str) -> str:
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


def load_with_admin(admin_path: str | None, user_path: str | None = None, **kw):
    """load_policy with `admin_path` as the admin file; the test user may own it (tests do not
    run as root everywhere), every other check applies. None: no admin file at all."""
    return load_policy(user_path, admin_path=admin_path or "/nonexistent/smartlaunch/policy.yaml",
                       admin_owners=frozenset({0, os.getuid()}), **kw)


def _can_install_admin() -> str | None:
    """None when as_admin_installed works here, else why not."""
    if os.geteuid() != 0:
        return "installing /etc/smartlaunch/policy.yaml in a mount namespace needs root"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare --mount fails here: {probe.stderr.strip()}"
    return None


_WHY_NOT = _can_install_admin()
needs_admin_install = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")

# $1 scratch dir, $2 policy file, $3 mode, then the command. Submounts of /etc (a container's
# /etc/hosts) are carried into the overlay so name resolution stays as it is.
_INSTALL = r"""set -e
d=$1; src=$2; mode=$3; shift 3
mkdir -p "$d/upper" "$d/work" "$d/merged"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$d/upper,workdir=$d/work" "$d/merged"
awk '$5 ~ "^/etc/" {print $5}' /proc/self/mountinfo | while read -r m; do
    mount --bind "$m" "$d/merged/${m#/etc/}"
done
mount --rbind "$d/merged" /etc
if [ "$src" != - ]; then
    install -D -o root -g root -m "$mode" "$src" /etc/smartlaunch/policy.yaml
else
    rm -f /etc/smartlaunch/policy.yaml
fi
exec "$@"
"""


def as_admin_installed(argv: list[str], policy_file: str | None, scratch: Path | str,
                       mode: str = "0644") -> list[str]:
    """argv run with `policy_file` installed as the admin policy (None: an /etc without one,
    whatever this machine has). `scratch`: an empty directory for the overlay."""
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _INSTALL, "sh",
            str(scratch), policy_file or "-", mode, *argv]


__all__ = ["ADMIN_POLICY_PATH", "POLICIES", "as_admin_installed", "load_with_admin",
           "needs_admin_install", "write"]
