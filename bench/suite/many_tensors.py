"""Hundreds of small gradient tensors (~1.3M parameters in 1,202 tensors: 300 residual blocks
of LayerNorm + Linear(64, 64)), batch 256.

Every gradient tensor costs DDP an autograd hook and copies into and out of its bucket, while
the bytes are few: the per-tensor work, not the link, is what DDP adds here.
"""
from __future__ import annotations

import torch
from torch import nn

import _harness as h


class Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=256, steps=60, warmup=5)
    p.add_argument("--blocks", type=int, default=300)
    p.add_argument("--dim", type=int, default=64)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    blocks, d = (6, 8) if args.tiny else (args.blocks, args.dim)
    model = nn.Sequential(*(Block(d) for _ in range(blocks)), nn.Linear(d, 10)).to(ctx.device)
    b, dev = args.batch_size, ctx.device
    batches = h.pool(4, lambda i: ((torch.randn(b, d, device=dev),),
                                   torch.randint(0, 10, (b,), device=dev)))
    h.train(ctx, args, "many-tensors", model,
            lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), batches, h.classify_loss)


if __name__ == "__main__":
    main()
