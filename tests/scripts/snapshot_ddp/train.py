"""A CUDA-only DDP job that snapshots every few epochs and resumes from the snapshot at start,
the shape of most tutorial and production jobs (written for smartlaunch's tests).

    torchrun --nproc-per-node N train.py TOTAL_EPOCHS SAVE_EVERY [--batch_size B] [--snapshot PATH]

It calls torch.cuda.set_device and NCCL unconditionally (the CPU dry run needs the CPU shim),
shards a synthetic dataset with DistributedSampler, and keeps its snapshot at a path relative
to the working directory: a snapshot left behind by anyone makes the next run resume.
"""
import argparse
import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def load_train_objs(n: int = 512):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 24, generator=g), torch.randn(n, 1, generator=g))
    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    return data, model, torch.optim.SGD(model.parameters(), lr=1e-3)


class Trainer:
    def __init__(self, model, loader, optimizer, save_every: int, snapshot: str):
        self.gpu = int(os.environ["LOCAL_RANK"])
        self.model = model.to(self.gpu)
        self.loader, self.optimizer = loader, optimizer
        self.save_every, self.snapshot = save_every, snapshot
        self.epochs_run = 0
        if os.path.exists(snapshot):
            state = torch.load(snapshot, map_location=f"cuda:{self.gpu}")
            self.model.load_state_dict(state["model"])
            self.epochs_run = state["epochs_run"]
            print(f"Resuming from snapshot at epoch {self.epochs_run}", flush=True)
        self.model = DistributedDataParallel(self.model, device_ids=[self.gpu])

    def run_epoch(self, epoch: int) -> None:
        self.loader.sampler.set_epoch(epoch)
        for x, y in self.loader:
            x, y = x.to(self.gpu), y.to(self.gpu)
            self.optimizer.zero_grad()
            F.mse_loss(self.model(x), y).backward()
            self.optimizer.step()

    def train(self, total_epochs: int) -> None:
        for epoch in range(self.epochs_run, total_epochs):
            self.run_epoch(epoch)
            if int(os.environ["RANK"]) == 0 and (epoch + 1) % self.save_every == 0:
                torch.save({"model": self.model.module.state_dict(), "epochs_run": epoch + 1},
                           self.snapshot)
                print(f"epoch {epoch + 1}: snapshot saved to {self.snapshot}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("total_epochs", type=int)
    ap.add_argument("save_every", type=int)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--snapshot", default="snapshot.pt")
    args = ap.parse_args()
    init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    data, model, optimizer = load_train_objs()
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=False,
                        sampler=DistributedSampler(data))
    Trainer(model, loader, optimizer, args.save_every, args.snapshot).train(args.total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    main()
