"""An MLP-Mixer under bf16 autocast (~59M parameters: 12 layers, 768 wide, 196 patches of
16x16 on 224x224 images), batch 64.

bf16 autocast halves the activations and the matmul time but not the gradients: weights and
their gradients stay fp32, so DDP all-reduces 4 bytes per parameter behind a shorter backward.
"""
from __future__ import annotations

import torch
from torch import nn

import _harness as h


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, d: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 384), nn.GELU(), nn.Linear(384, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, size: int, patch: int, d: int, layers: int, classes: int):
        super().__init__()
        tokens = (size // patch) ** 2
        self.stem = nn.Conv2d(3, d, patch, stride=patch)
        self.blocks = nn.Sequential(*(MixerBlock(tokens, d) for _ in range(layers)))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(dim=1))


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=64, steps=40, warmup=5)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    size, patch, d, layers = (32, 16, 16, 1) if args.tiny else (224, 16, 768, 12)
    model = Mixer(size, patch, d, layers, 1000).to(ctx.device)
    b, dev = args.batch_size, ctx.device
    batches = h.pool(4, lambda i: ((torch.randn(b, 3, size, size, device=dev),),
                                   torch.randint(0, 1000, (b,), device=dev)))
    h.train(ctx, args, "mixer-b16", model,
            lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.05), batches,
            h.classify_loss, amp_default="bf16")


if __name__ == "__main__":
    main()
