"""`smartlaunch-node prolog | epilog | baseline` (see smartlaunch.slurm.hooks)."""
from __future__ import annotations

from smartlaunch.slurm.hooks import DEFAULT_CONFIG

HELP = {
    "prolog": "Slurm prolog: check the job's GPUs against the baseline, snapshot the topology",
    "epilog": "Slurm epilog: stop leftovers on the job's GPUs, release leases, re-check health",
    "baseline": "record this node's current topology as the approved health baseline",
}


def register(subparsers) -> None:
    for mode, text in HELP.items():
        p = subparsers.add_parser(mode, help=text, description=text)
        p.add_argument("--config", default=None, metavar="PATH",
                       help=f"hooks config (KEY=VALUE, root-owned; default {DEFAULT_CONFIG})")
        p.set_defaults(func=_runner(mode))


def _runner(mode: str):
    def run(args) -> int:
        from smartlaunch.slurm import hooks
        return hooks.run(mode, args.config)
    return run
