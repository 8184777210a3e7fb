"""The one loop that drives any Launcher (launch/api.py) to its end: signals passed on, a signal
before the workers start exits 128+N, no worker left running and no lease held on any path."""
from __future__ import annotations

import signal
import sys
import time

from smartlaunch.errors import NoFreeGPUError
from smartlaunch.launch.api import LaunchContext, Launcher, LaunchResult
from smartlaunch.launch.signals import FORWARDED, TERMINATING, handling

POLL_S = 0.05


def run(launcher: Launcher, ctx: LaunchContext) -> int:
    """run_result(), its message printed to stderr; the exit code."""
    result = run_result(launcher, ctx)
    if result.message:
        print(result.message, file=sys.stderr, flush=True)
    return int(result.exit_code)


def run_result(launcher: Launcher, ctx: LaunchContext) -> LaunchResult:
    """Start the launcher and poll it to its end; a terminating signal before the workers
    start (ctx.hold or ctx.begin raise NoFreeGPUError) gives 128+N."""
    def on_signal(signum: int, _frame) -> None:
        if signum in TERMINATING:
            ctx.signals.append(signum)
        launcher.forward(signum)

    result: LaunchResult | None = None
    with handling(FORWARDED, on_signal):
        try:
            launcher.start()
            while (result := launcher.poll()) is None:
                time.sleep(POLL_S)
        except NoFreeGPUError:
            if not ctx.signals:              # a signal came first: nothing started, 128+N below
                raise
        finally:
            launcher.close(signal.SIGTERM)   # no-op after a clean end; stops all on an exception
            ctx.close()                      # every lease the launch took, on every path
        if result is None:
            result = LaunchResult.not_started(ctx.signals[0])
    return result
