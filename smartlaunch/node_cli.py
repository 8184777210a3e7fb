"""`smartlaunch-node`: node and admin commands (topology, policy, benchmarks, Slurm hooks).

Each subcommand lives with its layer in a module exposing `register(subparsers)`, which adds
a parser whose `func(args) -> int` runs it. Modules load lazily-cheaply: no NVML at import.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from smartlaunch.errors import SmartlaunchError
from smartlaunch.proc import Interrupted

SUBCOMMAND_MODULES = (
    "smartlaunch.topology.cli",     # topo
    "smartlaunch.policy.cli",       # policy check | show
    "smartlaunch.profile.cli",      # bench-comm, profile
    "smartlaunch.node_calibrate",   # calibrate (the cost model's per-node constants)
    "smartlaunch.slurm.cli",        # prolog | epilog | baseline
    "smartlaunch.launch.fleet",     # report (the decision log: the admins' fleet view)
)


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints a usage block before its error; a log wants one line, as smartlaunch's
    own parser gives. Subcommand parsers inherit the class (add_subparsers' default)."""

    def error(self, message):
        self.exit(2, f"smartlaunch-node: error: {message} (see `{self.prog} --help`)\n")


class _Version(argparse.Action):
    """--version: imports torch only when asked (the Slurm hooks run this command too)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from smartlaunch import version_line
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="smartlaunch-node", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action=_Version,
                        help="print smartlaunch's and torch's versions and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_usage(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except SmartlaunchError as exc:
        if args.debug:
            raise
        print(f"smartlaunch-node: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        # Ctrl-C in a measurement or a lease wait: its workers are killed and its leases
        # released on the way out (finally blocks); one line, 128 + SIGINT as the README says.
        if args.debug:
            raise
        print("smartlaunch-node: interrupted", file=sys.stderr)
        return 130
    except Interrupted as exc:      # the same in a dry run (`smartlaunch-node profile`)
        if args.debug:
            raise
        print(f"smartlaunch-node: {exc.line()}", file=sys.stderr)
        return int(exc.code)


def console_main() -> None:
    # As in smartlaunch's own console_main: torch's "Failed to initialize NumPy" is noise here.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    sys.exit(main())


if __name__ == "__main__":
    console_main()
