"""A small CIFAR-style CNN (~0.96M parameters: four 3x3 conv+BN+ReLU blocks, 32x32 input).

The kind of model the seeds found "never beneficial" on two GPUs: a few ms of compute per
step, BatchNorm buffers broadcast by DDP every forward.
"""
from __future__ import annotations

import torch
from torch import nn

import _harness as h


def block(cin: int, cout: int, pool: bool) -> list[nn.Module]:
    layers = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
    return layers + [nn.MaxPool2d(2)] if pool else layers


def build(width: int, classes: int = 10) -> nn.Sequential:
    w = width
    return nn.Sequential(*block(3, w, False), *block(w, 2 * w, True), *block(2 * w, 4 * w, True),
                         *block(4 * w, 4 * w, True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4 * w, classes))


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=128, steps=100, warmup=10)
    p.add_argument("--width", type=int, default=64)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    torch.backends.cudnn.benchmark = True
    width, size = (8, 16) if args.tiny else (args.width, 32)
    model = build(width).to(ctx.device)
    batches = h.pool(4, lambda i: ((torch.randn(args.batch_size, 3, size, size, device=ctx.device),),
                                   torch.randint(0, 10, (args.batch_size,), device=ctx.device)))
    h.train(ctx, args, "cnn-small", model,
            lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=5e-4),
            batches, h.classify_loss)


if __name__ == "__main__":
    main()
