"""The DDP training both decide scripts run (tiny_ddp.py, trial_env.py): a 32-64-4 MLP at
batch 16 in the gloo group the script has joined, then leave the group. Imported from the
script's own directory (sys.path[0], as under torchrun)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def train(steps: int = 10_000) -> None:
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(16, 32)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
