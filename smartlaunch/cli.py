"""`smartlaunch`: torchrun's own parser plus an option group of smartlaunch's, removed from
the namespace before it is handed to torch."""
from __future__ import annotations

import argparse
import copy
import importlib.util
import logging
import os
import shutil
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from smartlaunch import logconf
from smartlaunch.errors import SmartlaunchError, UsageError, reader_gone
from smartlaunch.logconf import LEVELS
from smartlaunch.request import Request
from smartlaunch.vocab import STRATEGY_CHOICES

log = logging.getLogger(__name__)

# (dest, option strings) of smartlaunch's own options; everything else is torchrun's.
OWN_OPTIONS = {
    "strategy": ("--strategy",),
    "explain": ("--explain",),
    "sl_policy": ("--policy",),
    "reprofile": ("--reprofile",),
    "each": ("--each",),
    "each_file": ("--each-file",),
    "no_wait": ("--no-wait",),
    "debug": ("--debug",),
    "quiet": ("--quiet",),
    "sl_log_level": ("--log-level",),
}
EXPLAIN_FORMATS = ("text", "json")


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints the whole usage block on error; a job log wants one line."""

    def error(self, message):
        raise UsageError(f"{message} (see `smartlaunch --help`)")


class _PrintAndExit(argparse.Action):
    """An option that prints `text()` and exits 0, as --help does."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None, text=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)
        self.text = text

    def __call__(self, parser, namespace, values, option_string=None):
        print(self.text(), end="")
        parser.exit()


def _version() -> str:
    from smartlaunch import version_line
    return version_line() + "\n"


def _torchrun_help() -> str:
    return build_parser(torchrun_help=True).format_help()


NPROC_HELP = ("the most processes (GPUs) per node the job may use; auto may choose fewer "
              "(default: every visible GPU). Values as torchrun's: auto, cpu, gpu, or a number")
# torchrun's options `smartlaunch --help` shows, with a shorter help.
TORCHRUN_SHOWN = {
    "--nnodes": "number of nodes, or a range MIN:MAX",
    "--nproc-per-node": NPROC_HELP,
    "--standalone": "a local rendezvous on a free port (single node)",
    "--module": "run the script as a module, as python -m does",
    "--no-python": "run the program directly, not with python",
}


def torchrun_parser() -> argparse.ArgumentParser:
    """torchrun's own parser, built from the installed torch's source without importing torch;
    on anything unexpected, torch's get_args_parser itself."""
    try:
        return _torchrun_parser_from_source()
    except Exception:
        from torch.distributed.run import get_args_parser
        return get_args_parser()


def _torchrun_parser_from_source() -> argparse.ArgumentParser:
    import ast
    import enum
    from pathlib import Path
    spec = importlib.util.find_spec("torch")          # found, not imported
    root = Path(spec.origin).parent

    def defs(relative: str, *names: str) -> list:
        tree = ast.parse((root / relative).read_text(), relative)
        found = [n for n in tree.body if getattr(n, "name", None) in names]
        if len(found) != len(names):
            raise LookupError(f"{relative}: {names} not found")
        return found
    util_spec = importlib.util.spec_from_file_location(
        "smartlaunch._torchrun_argparse_util", root / "distributed" / "argparse_util.py")
    util = importlib.util.module_from_spec(util_spec)
    util_spec.loader.exec_module(util)
    ns = {"__name__": "smartlaunch._torchrun", "os": os, "Enum": enum.Enum,
          "ArgumentParser": argparse.ArgumentParser, "REMAINDER": argparse.REMAINDER,
          "check_env": util.check_env, "env": util.env}
    exec(compile(ast.Module(defs("numa/binding.py", "AffinityMode"), []), "binding", "exec"), ns)
    ns["_AffinityMode"] = ns["AffinityMode"]
    exec(compile(ast.Module(defs("distributed/run.py", "get_args_parser"), []), "run", "exec"), ns)
    return ns["get_args_parser"]()


def build_parser(torchrun_help: bool = False) -> argparse.ArgumentParser:
    """torchrun's parser with smartlaunch's group first; torchrun_help: --help lists every
    torchrun option (else TORCHRUN_SHOWN only)."""
    parser = torchrun_parser()
    parser.__class__ = _OneLineParser
    parser.prog = "smartlaunch"
    parser.usage = "%(prog)s [options] training_script [script args ...]"
    parser.description = ("A drop-in torchrun that measures before it launches: one GPU, "
                          "independent jobs or DDP, whichever is fastest within the policy. "
                          "All torchrun options apply.")
    g = parser.add_argument_group("smartlaunch options")
    g.add_argument("--strategy", choices=STRATEGY_CHOICES, default="auto",
                   help="auto (default) decides from measurements; single, independent and "
                        "ddp force one (ddp behaves exactly like torchrun)")
    g.add_argument("--explain", nargs="?", const="text", choices=EXPLAIN_FORMATS, default=None,
                   help="print the plan (text, or json: see docs/plan-schema.md) and launch "
                        "nothing; what is not cached is measured first, on the GPUs (dry run, "
                        "all-reduce, trials)")
    g.add_argument("--policy", dest="sl_policy", metavar="PATH",
                   help="user policy file (default ./smartlaunch.yaml, then "
                        "~/.config/smartlaunch/policy.yaml)")
    g.add_argument("--reprofile", action="store_true", help="ignore the cached profile")
    g.add_argument("--each", action="append", default=[], metavar="ARGS",
                   help="run the script once per --each as independent jobs (one GPU each, "
                        "or a DDP group each when GPUs outnumber variants and that gives "
                        "more samples/s), ARGS appended to the script's arguments "
                        "(repeatable)")
    g.add_argument("--each-file", metavar="FILE",
                   help="like --each, one variant per line (# comments)")
    g.add_argument("--no-wait", action="store_true",
                   help="fail at once when no GPU is free instead of waiting")
    g.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    g.add_argument("--log-level", dest="sl_log_level", metavar="LEVEL", choices=LEVELS,
                   help="smartlaunch's own debug output on stderr, for a bug report: "
                        f"{', '.join(LEVELS)} (default: $SMARTLAUNCH_LOG_LEVEL, else none); "
                        "the workers' hook logs too")
    g.add_argument("--quiet", action="store_true",
                   help="no 'smartlaunch: <decision>' line before the job's output "
                        "(policy: launch.quiet)")
    g.add_argument("--version", action=_PrintAndExit, text=_version,
                   help="print smartlaunch's and torch's versions and exit")
    g.add_argument("--help-torchrun", action=_PrintAndExit, text=_torchrun_help,
                   help="list every torchrun option as well and exit")
    _arrange_help(parser, g, torchrun_help)
    return parser


def _arrange_help(parser: argparse.ArgumentParser, own, torchrun_help: bool) -> None:
    """Help layout only: smartlaunch's group (with -h), torchrun's options, the script."""
    positionals, torchrun = parser._positionals, parser._optionals
    help_action = next(a for a in torchrun._group_actions if "-h" in a.option_strings)
    torchrun._group_actions.remove(help_action)
    own._group_actions.insert(0, help_action)
    for action in torchrun._group_actions:
        shown = set(action.option_strings) & set(TORCHRUN_SHOWN)
        if "--nproc-per-node" in shown:
            action.help = NPROC_HELP
        elif not torchrun_help:
            action.help = TORCHRUN_SHOWN[shown.pop()] if shown else argparse.SUPPRESS
    for action in positionals._group_actions:
        action.help = ("the script (a module with -m, a program with --no-python), then its "
                       "own arguments") if action.dest == "training_script" else argparse.SUPPRESS
    torchrun.title = "torchrun options" if torchrun_help else \
        "torchrun options (the common ones; all apply: `smartlaunch --help-torchrun` lists them)"
    positionals.title = "the script"
    parser._action_groups = [own, torchrun, positionals]


def _options(parser, argv: list[str]) -> tuple[list[tuple[int, str, Any]], int]:
    """([(index, token, its action or None)] of the options before the script, the index
    where the script starts: everything from there on is the script's, `--debug` too)."""
    actions, out, i = parser._option_string_actions, [], 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return out, i + 1
        if not tok.startswith("-") or tok == "-":
            return out, i
        name = tok.split("=", 1)[0]
        action = actions.get(name)
        out.append((i, tok, action))
        takes_value = action is not None and action.nargs != 0 and "=" not in tok and not (
            len(name) == 2 and len(tok) > 2)  # -r3 style
        if action is not None and action.dest == "explain" and _bare(argv, i):
            takes_value = False
        i += 2 if takes_value else 1
    return out, i


def _bare(argv: list[str], i: int) -> bool:
    """Whether the --explain at argv[i] has no format after it."""
    return i + 1 >= len(argv) or argv[i + 1] not in EXPLAIN_FORMATS


def _normalize(parser, argv: list[str]) -> tuple[list[str], set[str]]:
    """(argv with a bare `--explain` as `--explain=text` and `--each ARGS` as `--each=ARGS`,
    the option dests given on the command line)."""
    out, given = list(argv), set()
    for i, tok, action in reversed(_options(parser, argv)[0]):    # later indices first
        if action is None:
            continue
        given.add(action.dest)
        if "=" in tok:
            continue
        if action.dest == "each" and i + 1 < len(argv):
            out[i:i + 2] = [f"--each={argv[i + 1]}"]
        elif action.dest == "explain" and _bare(argv, i):
            out[i] = "--explain=text"
    return out, given


def parse(argv: list[str], environ: Mapping[str, str] = os.environ) -> tuple[Request, set[str]]:
    parser = build_parser()
    argv, given = _normalize(parser, argv)
    typed = set(given)
    ns = parser.parse_args(argv)
    torchrun_ns = copy.copy(ns)
    for dest in OWN_OPTIONS:
        delattr(torchrun_ns, dest)
    if ns.sl_log_level:     # this process's output, and the workers' hook (they inherit it)
        os.environ[logconf.ENV] = ns.sl_log_level
        logconf.configure(ns.sl_log_level)
    if "nproc_per_node" not in given and "PET_NPROC_PER_NODE" in environ:
        given.add("nproc_per_node")

    request = Request(
        strategy=ns.strategy,
        max_gpus=_max_gpus(ns.nproc_per_node, _named("nproc_per_node", typed, environ))
        if "nproc_per_node" in given else None,
        script=ns.training_script,
        script_args=tuple(ns.training_script_args),
        module=ns.module,
        no_python=ns.no_python,
        variants=_variants(ns.each, ns.each_file),
        explain=ns.explain,
        policy_path=ns.sl_policy,
        reprofile=ns.reprofile,
        no_wait=ns.no_wait,
        debug=ns.debug,
        quiet=ns.quiet,
        nnodes=str(ns.nnodes),
        torchrun_args=torchrun_ns,
    )
    _check_nnodes(request.nnodes)
    if any(d.startswith(("rdzv", "master_addr")) for d in given) \
            or any(v.startswith(("PET_RDZV", "PET_MASTER_ADDR")) for v in environ):
        _check_rendezvous(torchrun_ns, typed, environ)     # the defaults need no torch to check
    _check_entrypoint(request)
    if request.variants and _forbids_variants(request.strategy):
        raise UsageError(f"--each/--each-file run independent jobs; they cannot be combined "
                         f"with --strategy {request.strategy} (drop one of them)")
    return request, given


def _forbids_variants(strategy: str) -> bool:
    from smartlaunch.decide.api import Variants
    from smartlaunch.strategies import REGISTRY
    unit = REGISTRY.get(strategy)
    return unit is not None and unit.VARIANTS == Variants.FORBIDDEN


def _named(dest: str, typed: set[str], environ: Mapping[str, str]) -> str:
    """How the user gave torchrun option `dest`: "--flag " or "PET_VAR="."""
    var = f"PET_{dest.upper()}"
    if dest not in typed and var in environ:
        return f"{var}="
    return "--" + dest.replace("_", "-") + " "


def _max_gpus(value: str, name: str = "--nproc-per-node ") -> int | None:
    if value in ("gpu", "auto", "cpu", "xpu"):
        return None
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"{name}{value!r} is not a number or one of gpu/auto/cpu; "
                         f"give the most GPUs the job may use, e.g. --nproc-per-node 2") from None
    if n < 1:
        raise UsageError(f"{name}{n} must be at least 1")
    return n


def _variants(each: list[str], each_file: str | None) -> tuple[tuple[str, ...], ...]:
    from smartlaunch.launch.variants import parse_each, parse_each_file
    variants = [parse_each(v) for v in each]
    if each_file:
        variants += parse_each_file(each_file)
    return tuple(variants)


def _check_nnodes(value: str) -> None:
    """torchrun's MIN:MAX (or N); torchrun itself exits 1 or asserts on 3:1."""
    parts = value.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        lo, hi = 0, -1
    if not 1 <= lo <= hi:
        raise UsageError(f"--nnodes {value!r} is not N or MIN:MAX with 1 <= MIN <= MAX; "
                         f"e.g. --nnodes 2 or --nnodes 1:4")


def _check_rendezvous(args: argparse.Namespace, typed: set[str],
                      environ: Mapping[str, str]) -> None:
    """--rdzv-* checked with torch's own parsers before anything starts (--standalone
    replaces backend and endpoint), and the store's host (the endpoint's, else --master-addr
    for the static backend) resolved."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
    from torch.distributed.elastic.rendezvous.utils import (
        _parse_rendezvous_config, parse_rendezvous_endpoint)

    def fail(dest: str, value: str, problem: str, fix: str) -> None:
        problem = problem.rstrip(".")
        raise UsageError(f"{_named(dest, typed, environ)}{value!r}: "
                         f"{problem[:1].lower()}{problem[1:]}; {fix}")

    try:
        _parse_rendezvous_config(args.rdzv_conf)
    except ValueError as exc:
        fail("rdzv_conf", args.rdzv_conf, str(exc), "give KEY=VALUE pairs separated by commas, "
             "e.g. --rdzv-conf join_timeout=900,read_timeout=60")
    if args.standalone:
        return
    # `_registry` is private: where a torch lacks it, the agent checks.
    known = sorted(getattr(rendezvous_handler_registry, "_registry", None) or ())
    if known and args.rdzv_backend not in known:
        fail("rdzv_backend", args.rdzv_backend, "not a rendezvous backend of the installed torch",
             f"use one of {', '.join(known)} (c10d for most jobs)")
    if args.rdzv_endpoint:
        try:
            host, _ = parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=29400)
        except ValueError as exc:
            fail("rdzv_endpoint", args.rdzv_endpoint, str(exc),
                 "give HOST:PORT, e.g. --rdzv-endpoint node0:29400 ([::1]:29400 for IPv6)")
        dest, value = "rdzv_endpoint", args.rdzv_endpoint
    elif args.rdzv_backend == "static" and getattr(args, "master_addr", None):
        host, dest, value = args.master_addr, "master_addr", args.master_addr
    else:
        return
    # torch's store retries a name that does not resolve, silently, for its whole timeout
    import socket
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as exc:
        fail(dest, value, f"its host {host!r} does not resolve here "
                          f"({getattr(exc, 'strerror', None) or exc})",
             "give the first node's hostname or address as this node resolves it")


def _find_module(name: str):
    """The spec of a dotted module name, found without running any package's code, where the
    ranks' `python -m` looks: the current directory first, not this launcher's own sys.path[0]
    (the console script's bin/ directory)."""
    from importlib.machinery import PathFinder
    parts = name.split(".")
    saved = sys.path[:]
    sys.path[:] = [os.getcwd(), *saved[1:]]
    try:
        spec = importlib.util.find_spec(parts[0])
        for part in parts[1:]:
            if spec is None or not spec.submodule_search_locations:
                return None
            spec = PathFinder.find_spec(f"{spec.name}.{part}",
                                        list(spec.submodule_search_locations))
    except (ImportError, ValueError):
        return None
    finally:
        sys.path[:] = saved
    return spec


def _check_entrypoint(request: Request) -> None:
    if request.no_python:
        _check_program(request.script)
    elif request.module:
        spec = _find_module(request.script)
        if spec is None:
            raise UsageError(f"module not found: {request.script} (check PYTHONPATH and the "
                             f"current directory, or drop -m to run a script path)")
        if spec.submodule_search_locations and _find_module(request.script + ".__main__") is None:
            raise UsageError(f"{request.script} is a package without __main__.py, so -m cannot "
                             f"run it; name the module to run (-m {request.script}.<module>)")
    elif os.path.isdir(request.script):
        raise UsageError(f"training script {request.script} is a directory; name the .py file "
                         f"in it (or use -m for a package)")
    elif not os.path.isfile(request.script):
        hint = " (use -m for a module)" if not request.script.endswith(".py") else ""
        if request.explain and not any(c in request.script for c in "./"):
            hint = (f" (if {request.script} was meant as --explain's format, write "
                    f"--explain={request.script}; formats: {', '.join(EXPLAIN_FORMATS)})")
        raise UsageError(f"training script not found: {request.script}{hint}; check the path "
                         f"relative to {os.getcwd()}")
    elif not os.access(request.script, os.R_OK):
        raise UsageError(f"training script {request.script} is not readable by you; "
                         f"chmod u+r {request.script}")


def _check_program(name: str) -> None:
    """--no-python's entrypoint as os.execvp takes it: a name without '/' on PATH only; a path
    an executable file with a #! line or a binary."""
    if "/" not in name:
        if shutil.which(name):
            return
        fix = ""
        if os.path.isfile(name):
            fix = f"; for the file here use ./{name}" + (
                "" if os.access(name, os.X_OK) else f" and chmod +x {name}")
        raise UsageError(f"program not found: {name} is not on PATH (with --no-python a name "
                         f"without '/' is looked up on PATH, as exec does){fix}")
    if os.path.isdir(name):
        raise UsageError(f"program {name} is a directory; name the executable in it")
    if not os.path.isfile(name):
        raise UsageError(f"program not found: {name}; check the path relative to {os.getcwd()}")
    if not os.access(name, os.X_OK):
        raise UsageError(f"program {name} is not executable; chmod +x {name} (or drop "
                         f"--no-python to run it with Python)")
    try:
        with open(name, "rb") as f:
            head = f.read(4)
    except OSError:
        return                          # execute-only: exec may still run it
    if not head.startswith((b"#!", b"\x7fELF")):
        raise UsageError(f"program {name} has no #! line, so exec cannot run it; add one (e.g. "
                         f"#!/usr/bin/env python3) or drop --no-python")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = False
    try:
        debug = "--debug" in argv[:_options(build_parser(), argv)[1]]
        logconf.configure(logconf.level_from(os.environ.get(logconf.ENV)))
        from smartlaunch.launch.worker import forget_outer_launch
        forget_outer_launch(os.environ)         # run from inside another launch's rank
        request, given = parse(argv)
        log.debug("smartlaunch %s", " ".join(argv))
        from smartlaunch.pipeline import run
        return run(request, given)
    except SmartlaunchError as exc:
        if debug:
            raise
        print(f"smartlaunch: {'error: ' if exc.exit_code else ''}{exc}", file=sys.stderr,
              flush=True)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return 128 + 2
    except BrokenPipeError:     # `smartlaunch --explain ... | head`
        if debug:
            raise
        return reader_gone()
    except SystemExit as exc:
        from smartlaunch.proc import Interrupted
        if debug or not isinstance(exc, Interrupted):
            raise
        print(f"smartlaunch: {exc.line()}", file=sys.stderr, flush=True)
        return int(exc.code)


def console_main() -> None:
    # torch's CPU wheel without numpy warns on import; the launcher never uses numpy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    code = main()
    # Everything of ours is done; skip the interpreter's seconds-long teardown of torch.
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:          # None: started with that descriptor closed
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    console_main()
