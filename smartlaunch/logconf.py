"""smartlaunch's debug output: the `smartlaunch` logger tree on stderr, only when asked
(`--log-level`, SMARTLAUNCH_LOG_LEVEL); the root logger is never touched."""
from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from smartlaunch.errors import UsageError

ENV = "SMARTLAUNCH_LOG_LEVEL"
LEVELS = ("debug", "info", "warning", "error")


def level_from(value: str | None, where: str = ENV) -> str | None:
    """The level `value` names (None: not set); UsageError naming `where` otherwise."""
    level = (value or "").strip().lower()
    if not level:
        return None
    if level not in LEVELS:
        raise UsageError(f"{where}={value} is not a log level; use one of {', '.join(LEVELS)}")
    return level


def configure(level: str | None) -> None:
    """Send the smartlaunch loggers' records at `level` and above to stderr (None: none)."""
    logger = logging.getLogger("smartlaunch")
    logger.propagate = False
    for h in list(logger.handlers):
        logger.removeHandler(h)
    if level is None:
        logger.addHandler(logging.NullHandler())
        logger.setLevel(logging.CRITICAL + 1)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s.%(msecs)03d smartlaunch[%(process)d] %(name)s: %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())


def from_environ(environ: Mapping[str, str]) -> None:
    """configure() from SMARTLAUNCH_LOG_LEVEL; an unknown value shows nothing."""
    try:
        configure(level_from(environ.get(ENV)))
    except UsageError:
        configure(None)
