"""Slow steps fed by a DataLoader with 2 worker processes; every process writes its pid to
$SLOW_PID_DIR/<phase>-<pid> (phase: dry, trial or run, from smartlaunch's variables), so a
test can check that none outlives smartlaunch. Steps take 0.5 s in the phase named by
$SLOW_PHASE (dry, trial or run), else 5 ms.
"""
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

PHASE = ("trial" if os.environ.get("SMARTLAUNCH_TRIAL") else
         "dry" if os.environ.get("SMARTLAUNCH_DRYRUN") else "run")
SLOW = os.environ.get("SLOW_PHASE") == PHASE


def mark() -> None:
    d = os.environ.get("SLOW_PID_DIR")
    if d:
        open(os.path.join(d, f"{PHASE}-{os.getpid()}"), "w").close()


class Data(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return torch.randn(16), torch.randn(1)


def main() -> None:
    mark()
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Data(), batch_size=8, num_workers=2, worker_init_fn=lambda _: mark())
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        time.sleep(0.5 if SLOW else 0.005)


if __name__ == "__main__":
    main()
