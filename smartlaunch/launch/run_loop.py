"""The one loop that drives any Launcher (launch/api.py) to its end.

What every strategy's launch guarantees lives here, once: the signals smartlaunch gets are
passed on (signals.py: SIGTERM, SIGINT, SIGHUP end the run; SIGUSR1/2, Slurm's early warning,
only reach the workers), a signal while waiting for GPUs, or before the workers start
(LaunchContext.begin), starts nothing and exits 128+N, an exception or a signal leaves no
worker running (close(), grace then SIGKILL) and no lease held (ctx.close()), and the exit
code and the final message come from the launcher's LaunchResult. When smartlaunch itself is
SIGKILLed, no handler runs: the guard (proc.py) ends every worker then, those proc.spawn()
started and the DDP ranks torch's agent started, which carry its tag (proc.guard_tag).
"""
from __future__ import annotations

import signal
import sys
import time

from smartlaunch.errors import NoFreeGPUError
from smartlaunch.launch.api import LaunchContext, Launcher, LaunchResult
from smartlaunch.launch.signals import TERMINATING, forward_signals

POLL_S = 0.05


def run(launcher: Launcher, ctx: LaunchContext) -> int:
    """run_result(), its message printed to stderr; the exit code."""
    result = run_result(launcher, ctx)
    if result.message:
        print(result.message, file=sys.stderr, flush=True)
    return int(result.exit_code)


def run_result(launcher: Launcher, ctx: LaunchContext) -> LaunchResult:
    """Start the launcher and poll it to its end. A terminating signal is the launcher's to
    act on (forward() at once, then poll() winds the run down within ctx.signal_grace_s);
    one before the workers start (the launcher's ctx.hold or ctx.begin raise NoFreeGPUError)
    gives 128+N here, whichever the launcher."""
    def on_signal(signum: int) -> None:
        if signum in TERMINATING:
            ctx.signals.append(signum)
        launcher.forward(signum)

    result: LaunchResult | None = None
    with forward_signals(on_signal):
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
