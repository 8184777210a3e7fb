"""Builds an optimizer, then never steps (stuck data loading): the time-limit case."""
import time

import torch

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
time.sleep(3600)
