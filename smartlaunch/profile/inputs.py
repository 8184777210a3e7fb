"""What the dry run reads off the script's inputs: a forward call's batch (the leading dimension of
its first tensor, looked for in arguments, mappings, sequences and dataclasses) and where the
script's own code first reads the world size before its first step ("file:line")."""
from __future__ import annotations

import dataclasses
import os
import sys
import sysconfig
from collections.abc import Callable, Mapping

MAX_NODES = 256          # containers looked into per call: a forward hook must stay cheap


def leading_dim(args, kwargs=None) -> int | None:
    """Batch of one forward call, or None when no tensor with a dimension is found."""
    t = _first_tensor([args, kwargs or {}], lambda t: t.dim() > 0)
    return None if t is None else int(t.shape[0])


def first_grad_tensor(output):
    """The first tensor in a forward call's output that requires grad, or None."""
    return _first_tensor([output], lambda t: t.requires_grad)


def _first_tensor(roots: list, want: Callable):
    """The first tensor t for which want(t) holds, depth first through what `roots` hold (a tensor
    is not looked into), at most MAX_NODES looked at; None."""
    import torch
    stack, seen = list(roots), 0
    while stack and seen < MAX_NODES:
        a = stack.pop(0)
        seen += 1
        if isinstance(a, torch.Tensor):
            if want(a):
                return a
        else:
            stack[:0] = _children(a)
    return None


def _children(a) -> list:
    """What a batch or an output holds, in order: mapping values, sequence items, dataclass fields;
    nothing for anything else."""
    if isinstance(a, Mapping):
        return list(a.values())
    if isinstance(a, (tuple, list)):
        return list(a)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return [getattr(a, f.name, None) for f in dataclasses.fields(a)]
    return []


# ---- world size reads ------------------------------------------------------------------------
_PACKAGES = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_SMARTLAUNCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")


def script_frame(frame, stdlib: tuple[str, ...]):
    """The caller in the script's own code, skipping standard-library frames, or None when a library
    (torch, transformers, smartlaunch) is the caller."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<"):      # "<frozen ...>": import machinery, look further out
            real = os.path.realpath(name)
            if any(p in real for p in _PACKAGES) or real.startswith(_SMARTLAUNCH):
                return None
            if not real.startswith(stdlib):
                return frame
        frame = frame.f_back
    return None


class WorldSizeWatch:
    """Records where the script's own code first reads the world size while `active()`: install()
    swaps os.environ's class for a subclass (same object) and wraps
    torch.distributed.get_world_size."""

    def __init__(self, active: Callable[[], bool]):
        self.active = active
        self.where: str | None = None
        paths = sysconfig.get_paths()
        self._stdlib = tuple(sorted({os.path.join(os.path.realpath(paths[k]), "")
                                     for k in ("stdlib", "platstdlib") if paths.get(k)}))

    def note(self, what: str, depth: int) -> None:
        if self.where is not None or not self.active():
            return
        frame = script_frame(sys._getframe(depth), self._stdlib)
        if frame is not None:
            self.where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} ({what})"

    def install(self, torch=None) -> None:
        self.install_environ()
        self.install_torch(torch)

    def install_environ(self) -> None:
        """The os.environ part, before the script runs (it may read the world size before it
        imports torch); once per watch."""
        if getattr(os.environ, "_smartlaunch_watch", None) is self:
            return
        watch = self

        class WatchedEnviron(type(os.environ)):
            _smartlaunch_watch = watch

            def __getitem__(self, key):
                if key == "WORLD_SIZE":
                    watch.note("reads WORLD_SIZE", 2)
                return super().__getitem__(key)

        try:
            os.environ.__class__ = WatchedEnviron
        except TypeError:   # an environ replaced by something else: no env reads seen
            pass

    def install_torch(self, torch) -> None:
        """torch.distributed.get_world_size, wrapped."""
        watch = self
        dist = getattr(torch, "distributed", None) if torch is not None else None
        if dist is None or not dist.is_available():
            return
        orig = dist.get_world_size

        def get_world_size(*args, **kwargs):
            watch.note("calls torch.distributed.get_world_size()", 2)
            return orig(*args, **kwargs)

        dist.get_world_size = get_world_size


def unique(params) -> list:
    """Tensors counted once: tied weights appear under two modules."""
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def wrapper_name(modules) -> str | None:
    """The data-parallel wrapper the script put around its model, if any."""
    for m in modules:
        names = {c.__name__ for c in type(m).__mro__}
        if "DistributedDataParallel" in names:
            return "DDP"
        if "FullyShardedDataParallel" in names or "FSDPModule" in names:
            return "FSDP"
    return None
