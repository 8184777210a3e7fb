"""A small MLP trained with a DataLoader: the profile tests' plain script.

--marker PATH appends one line per start (cache tests count dry runs); --workers N uses
DataLoader worker processes, each writing its pid to --pid-dir (tests check none is left).
"""
import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def build_model(width: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def _note_pid(worker_id):
    d = os.environ.get("TINY_PID_DIR")
    if d:
        open(os.path.join(d, str(os.getpid())), "w").close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--marker", default=None)
    ap.add_argument("--pid-dir", default=None)
    args = ap.parse_args()
    if args.marker:
        with open(args.marker, "a") as f:
            f.write(f"{os.getpid()}\n")
    if args.pid_dir:
        os.environ["TINY_PID_DIR"] = args.pid_dir
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        worker_init_fn=_note_pid, persistent_workers=args.workers > 0)
    model = build_model(args.width)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(args.epochs):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
    print("finished", loss.item())


if __name__ == "__main__":
    main()
