"""A GPT-2-small-style decoder (~124M parameters: 12 layers, 12 heads, 768 wide, block 512),
written here in the manner of nanoGPT; next-token loss on random tokens, bf16 autocast.

Batch 8 x 512 tokens per rank, AdamW; the embedding is tied to the output layer.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

import _harness as h


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, block: int, layers: int, heads: int, d: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=8, steps=20, warmup=5)
    p.add_argument("--block-size", type=int, default=512)
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50304)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    if args.tiny:
        args.block_size, args.n_layer, args.n_head, args.n_embd, args.vocab = 32, 2, 2, 32, 256
    model = GPT(args.vocab, args.block_size, args.n_layer, args.n_head, args.n_embd).to(ctx.device)
    b, t, v, dev = args.batch_size, args.block_size, args.vocab, ctx.device

    def make(i):
        tok = torch.randint(0, v, (b, t + 1), device=dev)
        return (tok[:, :-1],), tok[:, 1:]

    h.train(ctx, args, "gpt-124m", model,
            lambda ps: torch.optim.AdamW(ps, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1),
            h.pool(4, make), lambda out, y: F.cross_entropy(out.flatten(0, 1).float(), y.flatten()),
            amp_default="bf16")


if __name__ == "__main__":
    main()
