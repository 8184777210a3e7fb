"""Reading the policy layers and merging them into one `Policy`.

Layers, lowest first: built-in (api.py), admin (/etc/smartlaunch/policy.yaml, a fixed path),
user (--policy PATH, else ./smartlaunch.yaml, else ~/.config/smartlaunch/policy.yaml), env
(ENV_VARS), cli (enforce.apply_request); the admin's `enforce:` wins over all of them.
A user file is read only when owned by the user or root and writable by nobody else; the
admin file only when no non-root user could rewrite it (either could otherwise run code as,
or relax the rules for, other users).
"""
from __future__ import annotations

import errno
import fnmatch
import os
import stat
from collections.abc import Mapping
from typing import Any

from smartlaunch.errors import PolicyError
from smartlaunch.store import owner_name
from smartlaunch.policy.api import Policy, format_value
from smartlaunch.policy.rules import ENFORCE_MODES, SECTIONS, base_key, section_fields
from smartlaunch.policy.schema import ParsedFile, parse_text

ADMIN_POLICY_PATH = "/etc/smartlaunch/policy.yaml"
USER_POLICY_CWD = "smartlaunch.yaml"
USER_POLICY_HOME = os.path.join(".config", "smartlaunch", "policy.yaml")
ENV_VARS: dict[str, str] = {
    "SMARTLAUNCH_CACHE_DIR": "paths.cache_dir",
    "SMARTLAUNCH_LEASE_DIR": "paths.lease_dir",
    "SMARTLAUNCH_LOG_DIR": "launch.log_dir",
}
BUILT_IN = "built-in"
ROOT_ONLY = frozenset({0})
MAX_POLICY_BYTES = 1 << 20      # 1 MiB


def _open_policy(path: str, *, follow: bool) -> int:
    """The file opened read-only, non-blocking (a FIFO must not hang us), and unless
    `follow` without following a link at its last component."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        raise PolicyError(f"policy file {path} not found; check the path") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow and os.path.islink(path):
            raise PolicyError(
                f"policy file {path} is a symbolic link: smartlaunch follows no link to the policy "
                f"file it finds on its own, because another user could plant one; refusing it. "
                f"Fix: replace the link with the file it points to, or pass --policy "
                f"{os.path.realpath(path)}") from None
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror}; check its "
                          "permissions") from None


def _kind_of(st: os.stat_result) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(st.st_mode):
            return name
    return "not a regular file"


def user_file_problem(path: str, st: os.stat_result) -> str | None:
    """Why a user-layer policy file must not be read (the end of one line), or None: it must
    be owned by the user or root and writable by nobody else."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return (f"is owned by uid {st.st_uid} ({owner_name(st.st_uid)}), not by you: another "
                f"user could make smartlaunch run code as you; refusing it. Fix: delete it, or "
                f"copy it to a file you own and pass --policy")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        fix = f"chmod go-w {path}" if st.st_uid == me else \
            "copy it to a file you own (not group/world-writable) and pass --policy"
        return (f"is group/world-writable (mode {stat.S_IMODE(st.st_mode):04o}): another user "
                f"could make smartlaunch run code as you; refusing it. Fix: {fix}")
    return None


def read_policy_file(path: str, *, allow_enforce: bool, user_layer: bool = False,
                     follow: bool = True) -> ParsedFile:
    """One policy file, validated, checked and read on one descriptor. `follow`: False for
    files found without being named. PolicyError (one line) for every refusal."""
    fd = _open_policy(path, follow=follow)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise PolicyError(f"policy file {path} is a directory; name a .yaml file")
        if not stat.S_ISREG(st.st_mode):
            raise PolicyError(f"policy file {path} is {_kind_of(st)}, not a regular file; "
                              f"refusing it. Fix: name a .yaml file")
        refusal = user_file_problem(path, st)
        if user_layer and refusal:
            raise PolicyError(f"policy file {path} {refusal}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror}; check its "
                          "permissions") from None
    finally:
        os.close(fd)
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyError(f"policy file {path} is larger than {MAX_POLICY_BYTES >> 20} MiB "
                          f"(the limit for policy files); name the right file or shorten it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                          "save it as UTF-8") from None
    parsed = parse_text(text, path, allow_enforce=allow_enforce)
    parsed.user_refusal = refusal
    return parsed


def validate_file(path: str) -> ParsedFile:
    """`policy check FILE`: the file on its own, any owner, enforce: accepted."""
    return read_policy_file(path, allow_enforce=True)


def _ancestors(path: str) -> list[str]:
    out, parent = [], os.path.dirname(os.path.dirname(path))
    while parent not in out:
        out.append(parent)
        parent = os.path.dirname(parent)
    return out


def check_admin_permissions(path: str, trusted_uids: set[int]) -> None:
    """Refuse an admin file that a non-root user could rewrite, or swap out through any
    directory above it (sticky ones excepted above its own)."""
    checks = []
    for p in dict.fromkeys([os.path.abspath(path), os.path.realpath(path)]):
        checks += [(p, "file", False), (os.path.dirname(p), "directory", False)]
        checks += [(d, "directory", True) for d in _ancestors(p)]
    for p, what, sticky_ok in checks:
        try:
            st = os.stat(p)
        except OSError as exc:
            raise PolicyError(f"cannot inspect admin policy {what} {p}: {exc.strerror}; fix the "
                              "admin policy installation") from None
        if what == "file" and not stat.S_ISREG(st.st_mode):
            raise PolicyError(f"admin policy {p} is not a regular file; install a YAML file "
                              "there")
        if st.st_uid not in trusted_uids:
            raise PolicyError(f"admin policy {what} {p} is owned by uid {st.st_uid}, not root, so "
                              f"a non-root user could rewrite the admin rules; refusing it. Fix: "
                              f"sudo chown root {p}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (sticky_ok and
                                                            st.st_mode & stat.S_ISVTX):
            raise PolicyError(f"admin policy {what} {p} is group/world-writable (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}), so a non-root user could rewrite "
                              f"the admin rules; refusing it. Fix: sudo chmod go-w {p}")


def user_policy_path(user_path: str | None, environ: Mapping[str, str],
                     cwd: str) -> tuple[str, bool] | None:
    """(the user layer's file, whether a link there may be followed: only for --policy), or
    None. Whatever is at a found path is the user layer (a plant is refused, not skipped)."""
    if user_path is not None:
        user_path = os.path.join(cwd, os.path.expanduser(user_path))   # absolute stays as is
        if os.path.isdir(user_path):
            raise PolicyError(f"policy file {user_path} (--policy) is a directory; name the "
                              ".yaml file in it")
        if not os.path.isfile(user_path):
            raise PolicyError(f"policy file {user_path} (--policy) not found; check the path or "
                              "drop --policy")
        return user_path, True
    home = environ.get("HOME") or os.path.expanduser("~")
    for candidate in (os.path.join(cwd, USER_POLICY_CWD), os.path.join(home, USER_POLICY_HOME)):
        if os.path.lexists(candidate):
            return candidate, False
    return None


def builtin_values(policy: Policy | None = None) -> dict[str, Any]:
    """The policy's values (the built-in ones by default) flattened to dotted keys."""
    out: dict[str, Any] = {}
    for section in SECTIONS:
        obj = getattr(policy or Policy(), section)
        for name, kind in section_fields(section).items():
            value = getattr(obj, name)
            if kind == "nccl":
                out.update({f"{section}.{name}.{fam}": dict(v) for fam, v in value.items()})
            elif kind == "env":
                out.update({f"{section}.{name}.{var}": v for var, v in value.items()})
            else:
                out[f"{section}.{name}"] = value
    return out


def build_policy(values: Mapping[str, Any], **extra: Any) -> Policy:
    """A Policy from flat dotted values (every key of builtin_values() present)."""
    parts: dict[str, Any] = {}
    for section, cls in SECTIONS.items():
        kwargs: dict[str, Any] = {}
        for name, kind in section_fields(section).items():
            prefix = f"{section}.{name}."
            if kind in ("nccl", "env"):
                kwargs[name] = {k[len(prefix):]: (dict(v) if kind == "nccl" else v)
                                for k, v in values.items() if k.startswith(prefix)}
            else:
                kwargs[name] = values[f"{section}.{name}"]
        parts[section] = cls(**kwargs)
    return Policy(**parts, **extra)


def _enforce_one(key: str, current: Any, bound: Any) -> tuple[Any, bool]:
    """(effective value, whether the layer below was already stricter and is kept)."""
    mode = ENFORCE_MODES.get(base_key(key), "override")
    if mode == "max" and bound is not None:
        if current is not None and current < bound:
            return current, True
        return bound, False
    if mode == "min" and current > bound:
        return current, True
    if mode == "subset":
        kept = tuple(x for x in current if x in bound)
        if kept and set(kept) < set(bound):
            return kept, set(kept) == set(current)
        return (kept or bound), False
    return bound, False


def merge(layers: list[tuple[str, dict[str, Any]]], enforce: dict[str, Any] | None,
          admin_label: str | None) -> tuple[dict, dict, dict, dict]:
    """Apply layers in order, then the admin's enforce. Returns values, sources, enforced,
    notes (see Policy)."""
    values = builtin_values()
    sources = {k: BUILT_IN for k in values}
    for label, layer in layers:
        values.update(layer)
        sources.update({k: label for k in layer})
    enforced: dict[str, Any] = {}
    notes: dict[str, str] = {}
    for key, bound in (enforce or {}).items():
        current = values.get(key)
        effective, kept = _enforce_one(key, current, bound) if key in values else (bound, False)
        enforced[key] = bound
        rule = f"enforce.{key}={format_value(bound)} in {admin_label}"
        if kept:
            notes[key] = f"{sources[key]} value is within the admin rule {rule}"
        else:
            if key in values and current != effective and sources[key] != BUILT_IN:
                notes[key] = (f"{sources[key]} set {format_value(current)}; the admin rule "
                              f"{rule} wins")
            sources[key] = f"enforced:{admin_label}"
        values[key] = effective
    return values, sources, enforced, notes


def _check_consistent(values: dict[str, Any], sources: dict[str, str]) -> None:
    fallback, allowed = values["decision.fallback_strategy"], values["decision.allowed_strategies"]
    if fallback not in allowed:
        raise PolicyError(
            f"decision.fallback_strategy={fallback} ({sources['decision.fallback_strategy']}) is "
            f"not in decision.allowed_strategies={format_value(allowed)} "
            f"({sources['decision.allowed_strategies']}); set fallback_strategy to one of "
            f"{', '.join(allowed)}")


USER_ENV_KEY = "launch.user_env"


def check_user_env(parsed: ParsedFile, enforce: Mapping[str, Any] | None,
                   admin_label: str | None) -> None:
    """PolicyError naming the first variable (in file order) a user file's launch.env or
    launch.nccl sets that enforce.launch.user_env does not allow."""
    patterns = (enforce or {}).get(USER_ENV_KEY)
    if patterns is None:
        return
    found = []      # (line, dotted name, variable), in file order
    for key, value in parsed.values.items():
        if key.startswith("launch.env."):
            found.append((parsed.lines.get(key, 0), key, key.split(".", 2)[2]))
        elif key.startswith("launch.nccl."):
            found += [(parsed.lines.get(f"{key}.{var}", 0), f"{key}.{var}", var)
                      for var in value]
    for line, shown, var in sorted(found, key=lambda f: f[0]):
        if not any(fnmatch.fnmatchcase(var, p) for p in patterns):
            allowed = ", ".join(patterns) or "no variable"
            raise PolicyError(
                f"{parsed.path}:{line}: {shown}: users' policy files may set only {allowed} for "
                f"the workers (the admin rule enforce.{USER_ENV_KEY}="
                f"{format_value(tuple(patterns))} in {admin_label}); remove {var} from "
                f"{parsed.path}")


def _env_layer(environ: Mapping[str, str]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"env:{var}", {key: environ[var]}) for var, key in ENV_VARS.items()
            if environ.get(var, "").strip()]


def load_policy(user_path: str | None = None, *, environ: Mapping[str, str] | None = None,
                cwd: str | None = None, admin_path: str = ADMIN_POLICY_PATH,
                admin_owners: frozenset[int] = ROOT_ONLY) -> Policy:
    """The effective policy: built-in < admin < user file < env, then the admin's enforce."""
    environ = os.environ if environ is None else environ
    cwd = os.getcwd() if cwd is None else cwd
    layers: list[tuple[str, dict[str, Any]]] = []
    enforce: dict[str, Any] | None = None
    if os.path.lexists(admin_path):
        check_admin_permissions(admin_path, set(admin_owners))
        admin = read_policy_file(admin_path, allow_enforce=True)
        layers.append((f"admin:{admin_path}", admin.values))
        enforce = admin.enforce
    else:
        admin_path = None
    found = user_policy_path(user_path, environ, cwd)
    if found is not None and not (admin_path and os.path.exists(admin_path)
                                  and os.path.exists(found[0])
                                  and os.path.samefile(found[0], admin_path)):
        user, follow = found
        parsed = read_policy_file(user, allow_enforce=False, user_layer=True, follow=follow)
        check_user_env(parsed, enforce, admin_path)
        layers.append((f"user:{user}", parsed.values))
    layers += _env_layer(environ)
    values, sources, enforced, notes = merge(layers, enforce, admin_path)
    _check_consistent(values, sources)
    read = [BUILT_IN, *(label for label, _ in layers)]
    if enforce:
        read.append(f"enforced:{admin_path}")
    return build_policy(values, sources=sources, enforced=enforced, notes=notes,
                        admin_path=admin_path, layers=tuple(dict.fromkeys(read)))


def replace_values(policy: Policy, changes: Mapping[str, Any], label: str) -> Policy:
    """A copy of `policy` with some dotted keys set by `label` (the CLI layer)."""
    values = builtin_values(policy)
    values.update(changes)
    sources = dict(policy.sources, **{k: label for k in changes})
    layers = policy.layers + ((label,) if label not in policy.layers else ())
    return build_policy(values, sources=sources, enforced=dict(policy.enforced),
                        notes=dict(policy.notes), admin_path=policy.admin_path, layers=layers)

