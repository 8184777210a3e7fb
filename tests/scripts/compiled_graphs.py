"""A compiled model (torch.compile, the "eager" backend: dynamo's tracing and guards without a C
compiler) trained for --steps steps; at the end it prints how many graphs dynamo traced."""
import argparse

import torch
import torch._dynamo.utils
from torch import nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = torch.compile(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
                          backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.steps):
        x = torch.randn(8, 16)
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"graphs={torch._dynamo.utils.counters['stats']['unique_graphs']}", flush=True)


if __name__ == "__main__":
    main()
