"""A loop without a torch optimizer: manual SGD on the parameters. With --mark it calls
smartlaunch.profile_step() once per step (the opt-in marker)."""
import sys

import torch
from torch import nn

import smartlaunch


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def main():
    mark = "--mark" in sys.argv
    model = build_model()
    for _ in range(60):
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
        if mark:
            smartlaunch.profile_step()


if __name__ == "__main__":
    main()
