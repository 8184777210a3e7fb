"""What the pattern scripts share (tests/test_patterns.py): torchrun's contract on the CPU
(gloo when WORLD_SIZE > 1), a small model and data set, a DistributedSampler when distributed,
and a stack dump of every thread on SIGUSR1 (faulthandler, to stderr) for a run that hangs.

Each script is a torchrun-style training script with a --steps argument; alone it finishes in a
second or two of steps after `import torch`.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

FEATURES, CLASSES = 64, 8


def parser(description: str) -> argparse.ArgumentParser:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps, then it ends")
    ap.add_argument("--batch-size", type=int, default=32)
    return ap


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init(always: bool = False) -> bool:
    """Join the gloo group when distributed (or always): env:// under a launcher, else a
    file:// rendezvous of one. True when a group was initialised."""
    if world() == 1 and not always:
        return False
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group("gloo", init_method="env://")
    else:
        path = os.path.join(tempfile.mkdtemp(prefix="pattern-rdzv-"), "store")
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    return True


def done() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, CLASSES))


def wrap(m: nn.Module) -> nn.Module:
    if dist.is_initialized() and dist.get_world_size() > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(m)
    return m


def data(n: int = 16384) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, FEATURES, generator=g),
                         torch.randint(0, CLASSES, (n,), generator=g))


def sampler(dataset):
    if dist.is_initialized() and dist.get_world_size() > 1:
        return DistributedSampler(dataset, shuffle=True)
    return None


def loader(dataset, batch_size: int, **kw) -> DataLoader:
    s = sampler(dataset)
    return DataLoader(dataset, batch_size=batch_size, sampler=s, shuffle=s is None,
                      drop_last=True, **kw)


def batches(dl: DataLoader, steps: int):
    """(step, batch) for `steps` steps, epoch after epoch (the sampler's epoch set)."""
    step, epoch = 0, 0
    while True:
        if isinstance(dl.sampler, DistributedSampler):
            dl.sampler.set_epoch(epoch)
        for batch in dl:
            if step >= steps:
                return
            yield step, batch
            step += 1
        epoch += 1


def train(net: nn.Module, opt, dl: DataLoader, steps: int) -> None:
    """The plain loop every pattern ends with: `steps` steps, a last line, the group ended."""
    for _, (x, y) in batches(dl, steps):
        loss = train_step(net, opt, x, y)
    print(f"finished: loss {loss.item():.3f}", flush=True)
    done()


def train_step(net: nn.Module, opt, x, y) -> torch.Tensor:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    return loss
