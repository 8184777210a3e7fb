"""Decision layer: (ModelProfile, Topology, Policy, CommCurve, Request) -> frozen Plan."""
from smartlaunch.decide.plan import (  # noqa: F401
    Candidate, EnvVar, NumaBinding, Plan, Reason, Strategy,
)
