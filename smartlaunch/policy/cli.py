"""`smartlaunch-node policy check [FILE]` and `smartlaunch-node policy show`."""
from __future__ import annotations

import argparse
import sys

from smartlaunch.policy.load import ADMIN_POLICY_PATH, load_policy, validate_file
from smartlaunch.policy.schema import PolicyProblems


def register(subparsers) -> None:
    p = subparsers.add_parser("policy", help="validate policy files or show the effective policy")
    sub = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    check = sub.add_parser(
        "check", help="validate FILE, or with no FILE every layer that applies here",
        description="Exit 0 and print 'OK: FILE' when valid; otherwise print every "
                    "problem, one line each (file:line, key), and exit 3. FILE may be anyone's "
                    "(it is only read); a note says when a launch would refuse it as your "
                    "policy file (not yours or root's, or group/world-writable).")
    check.add_argument("file", nargs="?", metavar="FILE")
    check.add_argument("--policy", metavar="PATH", help="user policy (as smartlaunch --policy)")
    check.set_defaults(func=_check)
    show = sub.add_parser("show", help="print the effective merged policy with every value's "
                                       "source")
    show.add_argument("--policy", metavar="PATH", help="user policy (as smartlaunch --policy)")
    show.set_defaults(func=_show)


def _check(args: argparse.Namespace) -> int:
    """OK lines on stdout; otherwise one error line per problem of the first bad file."""
    try:
        return _check_files(args)
    except PolicyProblems as exc:
        if args.debug:
            raise
        for problem in exc.problems:
            print(f"smartlaunch-node: error: {problem}", file=sys.stderr)
        return int(exc.exit_code)


def _check_files(args: argparse.Namespace) -> int:
    if args.file is not None:
        parsed = validate_file(args.file)
        note = ""
        if parsed.enforce:
            n = len(parsed.enforce)
            note = (f" (enforces {n} key{'s' if n != 1 else ''}; enforce: is honoured only in "
                    f"{ADMIN_POLICY_PATH})")
        print(f"OK: {args.file}{note}")
        if parsed.user_refusal:
            print(f"note: a launch would refuse it as your policy file (--policy, "
                  f"./smartlaunch.yaml): it {parsed.user_refusal}")
        return 0
    policy = load_policy(args.policy)
    files = [label.split(":", 1)[1] for label in policy.layers
             if label.startswith(("admin:", "user:"))]
    for path in files or ["built-in defaults (no policy file found)"]:
        print(f"OK: {path}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from smartlaunch.policy.show import render
    print(render(load_policy(args.policy)), end="")
    return 0
