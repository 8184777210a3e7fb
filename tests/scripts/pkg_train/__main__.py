import argparse

import torch
from torch import nn

from pkg_train.model import build_model

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=6)
args = ap.parse_args()
model = build_model()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(1000):
    x, y = torch.randn(args.batch_size, 3, 16, 16), torch.randint(0, 4, (args.batch_size,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
