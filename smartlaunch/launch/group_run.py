"""One variant's DDP group as a process of its own: `python -m smartlaunch.launch.group_run SPEC`
(groups.write_spec). Its launcher runs through run_loop as any launch, on the parent's lease;
the one-line result goes to SPEC.result.json, the exit code is the group launch's."""
from __future__ import annotations

import json
import os
import pickle
import sys

from smartlaunch.errors import SmartlaunchError
from smartlaunch.launch.api import LaunchContext
from smartlaunch.store import open_private


class _HeldByParent(LaunchContext):
    """The parent (groups.GroupsLauncher) holds this group's lease for as long as it runs."""

    def hold(self, plan, count: int):
        return None


def main(argv: list[str]) -> int:
    with open(argv[0], "rb") as f:
        spec = pickle.load(f)
    os.unlink(argv[0])          # the environment it holds stays in this process only
    ctx = _HeldByParent(spec["policy"], spec["topology"], environ=spec["environ"],
                        torchrun_args=spec["torchrun_args"])
    from smartlaunch.launch.run_loop import run_result
    try:
        result = run_result(spec["make"](spec["plan"], ctx), ctx)
        code, message = int(result.exit_code), result.message
    except SmartlaunchError as exc:
        code, message = int(exc.exit_code), f"smartlaunch: error: {exc}"
    if message:
        print(message, file=sys.stderr, flush=True)
    first = message.splitlines()[0].removeprefix("smartlaunch: ") if message else ""
    try:
        with open_private(spec["result"], "w") as f:
            json.dump({"exit_code": code, "message": first}, f)
    except OSError:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
