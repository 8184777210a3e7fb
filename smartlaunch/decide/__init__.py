"""Decision layer: (ModelProfile, Topology, Policy, CommCurve, Request) -> frozen Plan."""
from smartlaunch.decide.plan import (  # noqa: F401
    Candidate, EnvVar, NumaBinding, Plan, Reason, Strategy,
)
# After this line the package attribute `decide` is the function, not the submodule.
from smartlaunch.decide.decide import decide, resolve  # noqa: F401,E402
from smartlaunch.decide.cost import CostModel  # noqa: F401,E402
