"""A tiny DDP training loop over gloo with one configurable misbehaving rank (tests only).

Environment:
  SLT_OUT          directory for <kind>-<pid> marker files (ranks and DataLoader workers)
  SLT_STEPS        number of steps (default 100000: tests end it)
  SLT_STEP_S       sleep per step (default 0.02)
  SLT_WORKERS      DataLoader worker processes (default 0)
  SLT_FAULT        exit | raise | kill | stop | loop | ignore_term (default none)
  SLT_FAULT_RANK   rank that misbehaves (default 1)
  SLT_FAULT_STEP   step after which it does (default 5)
  SLT_DDP          1: wrap the model in DistributedDataParallel (default: all-reduce by hand)
  SLT_SLOW_RANK    rank that works longer on every step (default none)
  SLT_SLOW_S       how much longer: a sleep before its forward (default 0.05)
"""
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

OUT = os.environ.get("SLT_OUT")
STEPS = int(os.environ.get("SLT_STEPS", "100000"))
STEP_S = float(os.environ.get("SLT_STEP_S", "0.02"))
WORKERS = int(os.environ.get("SLT_WORKERS", "0"))
FAULT = os.environ.get("SLT_FAULT", "")
FAULT_RANK = int(os.environ.get("SLT_FAULT_RANK", "1"))
FAULT_STEP = int(os.environ.get("SLT_FAULT_STEP", "5"))
# The DDP wrapper imports torch._dynamo: ~5 s per rank on a 2-core CI machine. The tests need
# blocking collectives, which the hand-written all-reduce gives as well.
USE_DDP = os.environ.get("SLT_DDP") == "1"
SLOW_RANK = int(os.environ.get("SLT_SLOW_RANK", "-1"))
SLOW_S = float(os.environ.get("SLT_SLOW_S", "0.05"))


def mark(kind):
    if OUT:
        open(os.path.join(OUT, f"{kind}-{os.getpid()}"), "w").close()


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        return torch.randn(8), torch.randn(1)


def worker_init(_):
    mark("loader")


def misbehave(rank, step):
    if rank != FAULT_RANK or step != FAULT_STEP or not FAULT:
        return
    mark("fault")            # its mtime is when the misbehaviour began
    if FAULT == "raise":
        raise RuntimeError(f"injected failure in rank {rank} at step {step}")
    if FAULT == "exit":
        os._exit(3)
    if FAULT == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if FAULT == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if FAULT == "loop":
        while True:          # spins in the script's own code between steps
            pass


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mark(f"rank{rank}")
    if FAULT == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    model = torch.nn.Linear(8, 1)
    if USE_DDP:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Data(), batch_size=4, num_workers=WORKERS,
                                         worker_init_fn=worker_init if WORKERS else None)
    t0 = time.perf_counter()
    step = 0
    for step, (x, y) in enumerate(loader, 1):
        if rank == SLOW_RANK:
            time.sleep(SLOW_S)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if not USE_DDP:
            for p in model.parameters():      # DDP's all-reduce, by hand
                dist.all_reduce(p.grad)
        opt.step()
        time.sleep(STEP_S)
        misbehave(rank, step)
        if step >= STEPS:
            break
    dt = time.perf_counter() - t0
    world = dist.get_world_size()
    if rank == 0:
        per_rank = 4 * step / dt
        print(f"throughput: samples/s={per_rank * world:.2f} per_rank={per_rank:.2f} world={world} "
              f"step_ms={1000 * dt / step:.3f}", flush=True)
    dist.destroy_process_group()
    # torch 2.13's DDP reducer takes ~10 s to tear down at interpreter exit on this CPU
    # machine (plain torchrun too); the tests are about launch behaviour, not that.
    os._exit(0)


if __name__ == "__main__":
    main()
