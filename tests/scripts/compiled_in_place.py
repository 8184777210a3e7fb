"""A model compiled in place (module.compile(), the "eager" backend): its root is called only
inside what torch.compile runs, never outside it."""
import torch
from torch import nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model.compile(backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(12):
        loss = model(torch.randn(8, 16)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
