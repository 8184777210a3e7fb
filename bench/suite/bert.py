"""A BERT-base-style encoder (~110M parameters: 12 layers, 768 wide, 12 heads, vocab 30522)
trained with a masked-LM loss on random tokens; sequence 128, batch 32, bf16 autocast.

Built from torch.nn.TransformerEncoderLayer, as many in-house encoders are; the MLM decoder
is tied to the token embedding.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import _harness as h


class Encoder(nn.Module):
    def __init__(self, vocab: int, seq: int, layers: int, heads: int, d: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.ln = nn.LayerNorm(d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, activation="gelu",
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.transform = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))
        self.decoder = nn.Linear(d, vocab)
        self.decoder.weight = self.tok.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.encoder(self.ln(self.tok(ids) + self.pos(pos)))
        return self.decoder(self.transform(x))


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=32, steps=20, warmup=5)
    p.add_argument("--seq-len", type=int, default=128)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    vocab, seq, layers, heads, d = ((128, 16, 2, 2, 32) if args.tiny
                                    else (30522, args.seq_len, 12, 12, 768))
    model = Encoder(vocab, seq, layers, heads, d).to(ctx.device)
    b, dev = args.batch_size, ctx.device

    def make(i):
        ids = torch.randint(0, vocab, (b, seq), device=dev)
        # MLM: predict 15% of positions, the rest ignored (-100), as BERT does.
        labels = torch.where(torch.rand(b, seq, device=dev) < 0.15, ids, torch.full_like(ids, -100))
        return (ids,), labels

    h.train(ctx, args, "bert-base", model, lambda ps: torch.optim.AdamW(ps, lr=1e-4),
            h.pool(4, make),
            lambda out, y: F.cross_entropy(out.flatten(0, 1).float(), y.flatten(), ignore_index=-100),
            amp_default="bf16")


if __name__ == "__main__":
    main()
