"""Profile layer: the dry run (`ModelProfile`) and the all-reduce benchmark (`CommCurve`)."""
from smartlaunch.profile.api import CommCurve, ModelProfile, ProfileStatus  # noqa: F401
