"""A deep, narrow MLP (13 layers 512 wide, ~3.2M parameters): launch-bound, a few ms a step on
one GPU, where anything a launcher adds to each step shows (bench/job_overhead.py)."""
from __future__ import annotations

import torch
from torch import nn

import _harness as h


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=256, steps=1500, warmup=20)
    p.add_argument("--layers", type=int, default=13)
    p.add_argument("--width", type=int, default=512)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    width = 32 if args.tiny else args.width
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, 10)).to(ctx.device)
    batches = h.pool(4, lambda i: ((torch.randn(args.batch_size, width, device=ctx.device),),
                                   torch.randint(0, 10, (args.batch_size,), device=ctx.device)))
    h.train(ctx, args, "deep-mlp", model, lambda ps: torch.optim.AdamW(ps, lr=1e-3),
            batches, h.classify_loss)


if __name__ == "__main__":
    main()
