"""Where no sandbox can be had (`dryrun.isolation: best-effort`): list what the working and script
directories hold before a dry run or trial, and afterwards delete what it created; what it changed
or deleted is only named. A tree over MAX_ENTRIES entries is not listed at all."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

MAX_ENTRIES = 20_000


@dataclass
class Listing:
    roots: tuple[str, ...]
    entries: dict[str, tuple] = field(default_factory=dict)   # path -> (is_dir, size, mtime_ns)
    complete: bool = True


def take(roots, skip=()) -> Listing:
    roots = tuple(dict.fromkeys(os.path.realpath(r) for r in roots))
    skip = tuple(os.path.realpath(s) for s in skip)
    out = Listing(roots)
    for root in roots:
        for top, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if not os.path.join(top, d).startswith(skip or ("\0",))]
            for name in dirs + files:
                path = os.path.join(top, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                out.entries[path] = (name in dirs, st.st_size, st.st_mtime_ns)
                if len(out.entries) > MAX_ENTRIES:
                    out.complete = False
                    out.entries.clear()
                    return out
    return out


def undo(before: Listing, skip=()) -> tuple[int, list[str]]:
    """Delete what appeared since `before`; (entries removed, paths changed or deleted)."""
    if not before.complete:
        return 0, []
    after = take(before.roots, skip)
    created = [p for p in after.entries if p not in before.entries]
    for path in sorted(created, key=len):
        if not os.path.lexists(path):
            continue                      # inside a directory removed just before
        try:
            if after.entries[path][0] and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            pass
    removed = sum(not os.path.lexists(p) for p in created)
    changed = [p for p, v in before.entries.items()
               if p not in after.entries or (not v[0] and after.entries[p] != v)]
    return removed, changed
