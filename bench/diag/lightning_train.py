"""A Lightning job of the usual shape: a LightningModule MLP on synthetic data, Trainer with
max_steps; under torchrun Lightning reads the torchelastic variables and runs DDP."""
import argparse
import os
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import lightning as L

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=400)
a = p.parse_args()


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096),
                                 nn.GELU(), nn.Linear(4096, 10))

    def training_step(self, batch, _):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


data = TensorDataset(torch.randn(65536, 1024), torch.randint(0, 10, (65536,)))
world = int(os.environ.get("WORLD_SIZE", "1"))
trainer = L.Trainer(max_steps=a.steps, accelerator="auto", devices=world if world > 1 else 1,
                    num_nodes=1, strategy="ddp" if world > 1 else "auto", precision="bf16-mixed",
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(Net(), DataLoader(data, batch_size=256, num_workers=2, shuffle=True))
