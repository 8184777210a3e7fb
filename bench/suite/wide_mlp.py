"""A wide MLP at a small batch (~120M parameters: 6144 wide, 4 hidden layers), batch 16, fp32.

Large gradients (480 MB) and little compute per step: each layer is a skinny matrix product
that reads its weights once, so the step is memory- and launch-bound, not FLOP-bound.
"""
from __future__ import annotations

import torch
from torch import nn

import _harness as h


def build(inp: int, width: int, layers: int, classes: int) -> nn.Sequential:
    mods: list[nn.Module] = [nn.Linear(inp, width), nn.GELU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*mods, nn.Linear(width, classes))


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=16, steps=200, warmup=10)
    p.add_argument("--width", type=int, default=6144)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    width, layers, inp = (32, 2, 16) if args.tiny else (args.width, args.layers, 1024)
    model = build(inp, width, layers, 100).to(ctx.device)
    b, dev = args.batch_size, ctx.device
    batches = h.pool(4, lambda i: ((torch.randn(b, inp, device=dev),),
                                   torch.randint(0, 100, (b,), device=dev)))
    h.train(ctx, args, "wide-mlp", model, lambda ps: torch.optim.AdamW(ps, lr=1e-4), batches,
            h.classify_loss)


if __name__ == "__main__":
    main()
