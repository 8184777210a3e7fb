"""A VGG-style BatchNorm conv net (~9.2M parameters: 8 conv+BN+ReLU layers, 64x64 images),
batch 64, fp32/TF32.

BatchNorm keeps running statistics that DDP broadcasts from rank 0 at every forward
(broadcast_buffers=True, the default), a collective before any compute of the step.
"""
from __future__ import annotations

import torch
from torch import nn

import _harness as h

WIDTHS = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


def build(scale: int, classes: int = 100) -> nn.Sequential:
    layers: list[nn.Module] = []
    cin = 3
    for w in WIDTHS:
        if w == "M":
            layers.append(nn.MaxPool2d(2))
            continue
        w = max(4, w // scale)
        layers += [nn.Conv2d(cin, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU()]
        cin = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=64, steps=150, warmup=10)
    p.add_argument("--image-size", type=int, default=64)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    torch.backends.cudnn.benchmark = True
    scale, size = (16, 32) if args.tiny else (1, args.image_size)
    model = build(scale).to(ctx.device)
    b, dev = args.batch_size, ctx.device
    batches = h.pool(4, lambda i: ((torch.randn(b, 3, size, size, device=dev),),
                                   torch.randint(0, 100, (b,), device=dev)))
    h.train(ctx, args, "bn-convnet", model,
            lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True), batches,
            h.classify_loss)


if __name__ == "__main__":
    main()
