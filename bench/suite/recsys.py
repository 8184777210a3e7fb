"""A DLRM-style recommender (~21.0M parameters, 95% of them in 26 embedding tables).

Embedding-heavy: almost no compute per step but 84 MB of dense gradients to all-reduce,
so the link decides everything. Tables use dense gradients (nn.Embedding's default, and
what DDP all-reduces); 13 dense features, click/no-click target.
"""
from __future__ import annotations

import torch
from torch import nn

import _harness as h


def mlp(*widths: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class DLRM(nn.Module):
    def __init__(self, tables: int, rows: int, dim: int, dense: int):
        super().__init__()
        self.emb = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        self.bottom = mlp(dense, 256, dim)
        self.top = mlp((tables + 1) * dim, 512, 256, 1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        feats = [self.bottom(dense)] + [e(sparse[:, i]) for i, e in enumerate(self.emb)]
        return self.top(torch.cat(feats, dim=1)).squeeze(1)


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=2048, steps=60, warmup=10)
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--rows", type=int, default=12_000)
    p.add_argument("--dim", type=int, default=64)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    tables, rows, dim = (4, 100, 8) if args.tiny else (args.tables, args.rows, args.dim)
    model = DLRM(tables, rows, dim, dense=13).to(ctx.device)
    b, dev = args.batch_size, ctx.device
    batches = h.pool(4, lambda i: ((torch.randn(b, 13, device=dev),
                                    torch.randint(0, rows, (b, tables), device=dev)),
                                   torch.randint(0, 2, (b,), device=dev).float()))
    h.train(ctx, args, "recsys-dlrm", model, lambda ps: torch.optim.Adam(ps, lr=1e-3),
            batches, lambda out, y: nn.functional.binary_cross_entropy_with_logits(out.float(), y))


if __name__ == "__main__":
    main()
