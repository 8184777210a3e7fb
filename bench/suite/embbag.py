"""An EmbeddingBag recommender (~77M parameters: 12 tables of 200,000 x 32, multi-hot bags of
10 ids summed per table, a small interaction MLP), batch 4096.

Embedding-heavy like recsys.py, but through nn.EmbeddingBag with dense gradients: 300 MB of
gradient per step for a step of a few ms, so whether DDP pays is a question of how much of the
all-reduce the GPU can hide, not of compute.
"""
from __future__ import annotations

import torch
from torch import nn

import _harness as h


class BagRec(nn.Module):
    def __init__(self, tables: int, rows: int, dim: int, dense: int):
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.dense = nn.Sequential(nn.Linear(dense, 128), nn.ReLU(), nn.Linear(128, dim))
        self.top = nn.Sequential(nn.Linear((tables + 1) * dim, 256), nn.ReLU(),
                                 nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        # ids: (batch, tables, bag) -> one bag per table and sample
        feats = [self.dense(dense)] + [bag(ids[:, i]) for i, bag in enumerate(self.bags)]
        return self.top(torch.cat(feats, dim=1)).squeeze(1)


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=4096, steps=100, warmup=10)
    p.add_argument("--tables", type=int, default=12)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--bag", type=int, default=10)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    tables, rows, dim, bag = (3, 50, 4, 3) if args.tiny else (args.tables, args.rows, args.dim, args.bag)
    model = BagRec(tables, rows, dim, dense=16).to(ctx.device)
    b, dev = args.batch_size, ctx.device
    batches = h.pool(4, lambda i: ((torch.randn(b, 16, device=dev),
                                    torch.randint(0, rows, (b, tables, bag), device=dev)),
                                   torch.randint(0, 2, (b,), device=dev).float()))
    h.train(ctx, args, "embbag-rec", model, lambda ps: torch.optim.Adam(ps, lr=1e-3), batches,
            lambda out, y: nn.functional.binary_cross_entropy_with_logits(out.float(), y))


if __name__ == "__main__":
    main()
