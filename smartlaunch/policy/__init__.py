"""Policy layer: built-in < admin < user, with the admin's `enforce:` on top."""
from smartlaunch.policy.api import (  # noqa: F401
    DecisionPolicy, DryRunPolicy, JobsPolicy, LaunchPolicy, PathsPolicy, Policy,
)
