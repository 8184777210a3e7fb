"""An image-training script of the usual shape: small ResNet, bf16 autocast, channels_last,
a DataLoader with workers that build and augment synthetic images."""
import argparse, os, time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--workers", type=int, default=6)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--size", type=int, default=32)
p.add_argument("--compile", action="store_true")
a = p.parse_args()

class Synthetic(Dataset):
    def __len__(self): return 1 << 20
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.rand(3, a.size, a.size, generator=g)
        if torch.rand(1, generator=g).item() < 0.5:
            x = x.flip(-1)
        x = (x - 0.5) / 0.25
        return x, i % 10

class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))

world = int(os.environ.get("WORLD_SIZE", "1"))
cuda = torch.cuda.is_available()
if world > 1:
    dist.init_process_group("nccl" if cuda else "gloo")
rank = int(os.environ.get("RANK", "0"))
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)
model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), Block(32), Block(32),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
model = model.to(dev, memory_format=torch.channels_last)
if world > 1:
    model = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
if a.compile:
    model = torch.compile(model)
ds = Synthetic()
sampler = DistributedSampler(ds) if world > 1 else None
loader = DataLoader(ds, batch_size=a.batch, sampler=sampler, shuffle=sampler is None,
                    num_workers=a.workers, persistent_workers=a.workers > 0, pin_memory=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
t0, n = time.time(), 0
for step, (x, y) in enumerate(loader):
    x = x.to(dev, non_blocking=True).to(memory_format=torch.channels_last)
    y = y.to(dev, non_blocking=True)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    n += x.shape[0]
    if step + 1 >= a.steps:
        break
if rank == 0:
    print(f"done {step + 1} steps, {n * world / (time.time() - t0):.0f} samples/s", flush=True)
if world > 1:
    dist.destroy_process_group()
