"""A training loop whose model takes its batch in one of the shapes real scripts use.

--input: tensor (model(x)), kwargs (model(**inputs), as a Hugging Face Trainer calls it),
dict (model(batch_dict)), list (model([x, mask])), mapping (a UserDict like HF's
BatchEncoding, passed as **inputs), dataclass (model(Batch(...))).
--accum K: K micro-batches per optimizer step (loss / K, one step() at the end).
--world-size-read: env (the script divides its accumulation by WORLD_SIZE, as nanoGPT does),
sampler (only torch asks: init_process_group and a DistributedSampler), none.
--steps N then --end: return | exit (sys.exit(0)) | raise (RuntimeError) after N steps.
"""
import argparse
import collections
import dataclasses
import os
import sys

import torch
from torch import nn


@dataclasses.dataclass
class Batch:
    features: torch.Tensor
    labels: torch.Tensor


class Encoding(collections.UserDict):
    """Shaped like transformers.BatchEncoding: a UserDict with attribute access."""

    def __getattr__(self, name):
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 4))

    def forward(self, features=None, labels=None, **extra):
        if isinstance(features, Batch):
            features, labels = features.features, features.labels
        elif isinstance(features, dict):
            features, labels = features["features"], features["labels"]
        elif isinstance(features, list):
            features, labels = features
        out = self.net(features)
        return {"loss": nn.functional.cross_entropy(out, labels), "logits": out}


def call(model, kind, x, y):
    if kind == "tensor":
        return model(x, y)
    if kind == "kwargs":
        return model(features=x, labels=y)
    if kind == "dict":
        return model({"features": x, "labels": y})
    if kind == "list":
        return model([x, y])
    if kind == "mapping":
        return model(**Encoding(features=x, labels=y))
    return model(Batch(x, y))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", default="tensor")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--world-size-read", default="none")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--end", default="return")
    args = ap.parse_args()
    accum = args.accum
    if args.world_size_read == "env":
        accum //= int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    model = Model(32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    if args.world_size_read == "sampler":
        # only library code asks: init_process_group reads WORLD_SIZE, the sampler calls
        # torch.distributed.get_world_size()
        torch.distributed.init_process_group("gloo")
        torch.utils.data.DistributedSampler(data)
    with torch.no_grad():          # an evaluation pass: not a training micro-batch
        model(torch.randn(3, 16), torch.zeros(3, dtype=torch.long))
    for step in range(args.steps):
        for _ in range(accum):
            x, y = torch.randn(args.batch, 16), torch.randint(0, 4, (args.batch,))
            loss = call(model, args.input, x, y)["loss"] / accum
            loss.backward()
        opt.step()
        opt.zero_grad()
    if args.end == "exit":
        sys.exit(0)
    if args.end == "raise":
        raise RuntimeError("the script failed after its steps")


if __name__ == "__main__":
    main()
