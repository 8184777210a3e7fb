"""Which world-size variables the script itself read during the dry run (issue 14).

A script that fixes its world size (Lightning's `Trainer(devices=2)` checks WORLD_SIZE) fails
before its first step under the dry run's WORLD_SIZE=1 although torchrun runs it; a script
with a real bug fails the same way under both. The difference we can see: the first one read
WORLD_SIZE (or LOCAL_WORLD_SIZE) itself. Reads by torch (the env:// rendezvous of every
init_process_group) and by smartlaunch do not count.
"""
from __future__ import annotations

import os
import sys

WATCHED = frozenset({"WORLD_SIZE", "LOCAL_WORLD_SIZE"})
_SKIP = (os.path.dirname(os.__file__) + os.sep + "os.py", "_collections_abc.py", __file__)


class _Reads:
    names: set[str] = set()


def _by_the_script() -> bool:
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename.endswith(_SKIP)
                             or f.f_code.co_filename.startswith("<frozen ")):   # os, Mapping.get
        f = f.f_back
    if f is None:
        return False
    name = f.f_code.co_filename
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torch = sys.modules.get("torch")
    torch_dir = os.path.dirname(torch.__file__) if torch is not None and torch.__file__ else None
    return not (name.startswith(own + os.sep) or (torch_dir and name.startswith(torch_dir + os.sep)))


def install() -> None:
    base = type(os.environ)

    class Watched(base):
        def __getitem__(self, key):
            if key in WATCHED and _by_the_script():
                _Reads.names.add(key)
            return base.__getitem__(self, key)

    os.environ.__class__ = Watched


def reads() -> list[str]:
    return sorted(_Reads.names)
