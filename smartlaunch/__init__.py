"""smartlaunch: a torchrun replacement that measures before it launches."""
from __future__ import annotations

__version__ = "0.1.0"       # pyproject.toml's [project] version


def version_line() -> str:
    """`smartlaunch <version> (torch <version>)` for --version. Imports torch."""
    from importlib import metadata
    try:
        ours = metadata.version("smartlaunch")
    except metadata.PackageNotFoundError:
        ours = __version__
    import torch
    return f"smartlaunch {ours} (torch {torch.__version__})"

_step_hook = None  # installed by smartlaunch.profile.dryrun / smartlaunch.launch.worker


def profile_step() -> None:
    """Mark the end of one training step (for loops without a torch optimizer)."""
    if _step_hook is not None:
        _step_hook()
