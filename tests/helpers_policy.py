"""Helpers for the policy tests: policy files in tmp dirs and the test-only admin switch."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from smartlaunch.policy.load import ADMIN_POLICY_PATH, TEST_ADMIN_ENV, TEST_UID_ENV

REPO = Path(__file__).resolve().parent.parent
POLICIES = REPO / "policies"

# The test switch is ignored on a machine with a real admin policy (by design; see load.py).
needs_no_system_admin_policy = pytest.mark.skipif(
    os.path.lexists(ADMIN_POLICY_PATH),
    reason=f"{ADMIN_POLICY_PATH} exists here, so the test-only admin switch is ignored")


def write(directory: Path | str, name: str, text: str) -> str:
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


def admin_environ(admin_path: str | None = None, **extra: str) -> dict[str, str]:
    """The process environment (after clean_env) plus the test-only admin switch."""
    env = dict(os.environ)
    env.setdefault("PYTEST_CURRENT_TEST", "helpers_policy")
    if admin_path is not None:
        env[TEST_ADMIN_ENV] = admin_path
        env[TEST_UID_ENV] = str(os.getuid())
    env.update(extra)
    return env
