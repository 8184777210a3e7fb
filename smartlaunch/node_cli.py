"""`smartlaunch-node`: node and admin commands (topology, policy, benchmarks, Slurm hooks).

Each subcommand's module exposes `register(subparsers)`, adding a parser whose `func(args) ->
int` runs it (no NVML at import).
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from pathlib import Path

from smartlaunch.errors import SmartlaunchError, UsageError, reader_gone
from smartlaunch.proc import Interrupted

SUBCOMMAND_MODULES = (
    "smartlaunch.topology.cli",     # topo
    "smartlaunch.policy.cli",       # policy check | show
    "smartlaunch.profile.cli",      # bench-comm, profile
    "smartlaunch.node_calibrate",   # calibrate (the cost model's per-node constants)
    "smartlaunch.slurm.cli",        # prolog | epilog | baseline
    "smartlaunch.launch.fleet",     # report (the decision log: the admins' fleet view)
)

# The package data the admin docs install: (heading, package directory).
PACKAGE = Path(__file__).resolve().parent
SHIPPED = (("Slurm node hooks and submit filter (docs/slurm-admin.md)",
            PACKAGE / "slurm" / "scripts"),
           ("Policies (docs/policy.md)", PACKAGE / "policy" / "shipped"))


class _OneLineParser(argparse.ArgumentParser):
    """Errors in one line; subcommand parsers inherit the class."""

    def error(self, message):
        self.exit(2, f"smartlaunch-node: error: {message} (see `{self.prog} --help`)\n")

    def command_list(self) -> str:
        """What `git` prints without a command: the usage line, then one line per command."""
        sub = next(a for a in self._actions if isinstance(a, argparse._SubParsersAction))
        rows = [(c.dest, c.help or "") for c in sub._choices_actions]
        width = max(len(name) for name, _ in rows) + 2
        return (self.format_usage() + "\ncommands:\n"
                + "".join(f"  {name:<{width}}{text}\n" for name, text in rows)
                + f"\n`{self.prog} COMMAND --help` shows a command's options.\n")


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
    files = sub.add_parser(
        "files", help="where the Slurm hook scripts and the shipped policies are installed",
        description="Without NAME: every file the admin docs install, under its package "
                    "directory. With NAME (e.g. prolog, shared-cluster.yaml): that file's "
                    "absolute path alone, for `install \"$(smartlaunch-node files prolog)\" ...`.")
    files.add_argument("name", nargs="?", metavar="NAME")
    files.set_defaults(func=_files)
    return parser


def shipped_files() -> dict[str, list[Path]]:
    """{heading: the files of that kind in the installed package, by name}."""
    return {head: sorted(p for p in folder.iterdir() if p.is_file() and p.name[0] != ".")
            for head, folder in SHIPPED}


def _files(args) -> int:
    found = shipped_files()
    if args.name is None:
        for head, paths in found.items():
            print(f"{head}:")
            print("".join(f"  {p}\n" for p in paths), end="")
        return 0
    match = [p for paths in found.values() for p in paths if p.name == args.name]
    if not match:
        names = ", ".join(p.name for paths in found.values() for p in paths)
        raise UsageError(f"no shipped file named {args.name!r}; the names are: {names}")
    print(match[0])
    return 0


def _parse(parser: _OneLineParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, but an argument a subcommand does not take is that subcommand's error."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        owner = parser
        while True:             # down to the deepest command given (`policy check`)
            sub = next((a for a in owner._actions if isinstance(a, argparse._SubParsersAction)),
                       None)
            chosen = getattr(args, sub.dest, None) if sub is not None else None
            if sub is None or chosen not in sub.choices:
                break
            owner = sub.choices[chosen]
        owner.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    if not getattr(args, "func", None):
        print(parser.command_list(), end="", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except SmartlaunchError as exc:
        if args.debug:
            raise
        print(f"smartlaunch-node: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("smartlaunch-node: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # `smartlaunch-node report | head`
        if args.debug:
            raise
        return reader_gone()
    except Interrupted as exc:      # the same in a dry run (`smartlaunch-node profile`)
        if args.debug:
            raise
        print(f"smartlaunch-node: {exc.line()}", file=sys.stderr)
        return int(exc.code)


def console_main() -> None:
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    sys.exit(main())


if __name__ == "__main__":
    console_main()
