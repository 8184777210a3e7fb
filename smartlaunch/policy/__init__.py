"""Policy layer: built-in < admin < user < env < CLI, with the admin's `enforce:` on top."""
from smartlaunch.policy.api import (  # noqa: F401
    DecisionPolicy, DryRunPolicy, JobsPolicy, LaunchPolicy, PathsPolicy, Policy, SlurmPolicy,
)


def __getattr__(name):
    # Lazy: importing the data types must not pull in yaml and the loader.
    if name in ("load_policy", "validate_file", "ADMIN_POLICY_PATH", "ENV_VARS"):
        from smartlaunch.policy import load
        return getattr(load, name)
    if name in ("check_request", "apply_request", "enforced_env"):
        from smartlaunch.policy import enforce
        return getattr(enforce, name)
    raise AttributeError(f"module 'smartlaunch.policy' has no attribute {name!r}")
