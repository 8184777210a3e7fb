"""Gradient accumulation with no_sync (~25M-parameter pre-norm transformer encoder, 6 layers,
512 wide, 256 tokens): 4 micro-batches of 8 per optimizer step, fp32.

Under DDP the first three micro-batches run inside `model.no_sync()`, so gradients are
all-reduced once per optimizer step while the compute is four micro-batches: the all-reduce
is amortised over 4x the work. The script reports samples per optimizer step (32 per rank).
"""
from __future__ import annotations

import torch
from torch import nn

import _harness as h


class Encoder(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, classes: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(tokens)).mean(dim=1))


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=8, steps=40, warmup=4)
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--seq", type=int, default=256)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    vocab, d, layers, heads, seq = (100, 16, 1, 2, 8) if args.tiny else (32000, 512, 6, 8, args.seq)
    model = Encoder(vocab, d, layers, heads, 2).to(ctx.device)
    b, dev = args.batch_size, ctx.device
    batches = h.pool(8, lambda i: ((torch.randint(0, vocab, (b, seq), device=dev),),
                                   torch.randint(0, 2, (b,), device=dev)))
    h.train(ctx, args, "accum-encoder", model,
            lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01), batches,
            h.classify_loss, accum=args.accum)


if __name__ == "__main__":
    main()
