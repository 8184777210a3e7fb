"""A 2-layer LSTM sequence classifier (~0.47M parameters; 100 steps of 32 features).

The seeds list LSTMs of 300K-500K parameters among models that never gain from a second GPU:
cuDNN's recurrent kernels are latency-bound, the gradient is under 2 MB.
"""
from __future__ import annotations

import torch
from torch import nn

import _harness as h


class Classifier(nn.Module):
    def __init__(self, features: int, hidden: int, layers: int, classes: int = 10):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=64, steps=60, warmup=10)
    p.add_argument("--seq-len", type=int, default=100)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--hidden", type=int, default=192)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    seq, feat, hidden = (8, 4, 16) if args.tiny else (args.seq_len, args.features, args.hidden)
    model = Classifier(feat, hidden, 2).to(ctx.device)
    batches = h.pool(4, lambda i: ((torch.randn(args.batch_size, seq, feat, device=ctx.device),),
                                   torch.randint(0, 10, (args.batch_size,), device=ctx.device)))
    h.train(ctx, args, "lstm", model, lambda ps: torch.optim.Adam(ps, lr=1e-3),
            batches, h.classify_loss)


if __name__ == "__main__":
    main()
