"""A frozen backbone with a small trainable head (~38M-parameter conv backbone with
requires_grad=False, a 2-layer head of ~0.6M parameters), batch 128 of 96x96 images, fp32/TF32.

Fine-tuning / linear-probe style: the forward pass is heavy, backward only reaches the head,
so DDP all-reduces ~2.4 MB per step behind a step that is almost all forward.
"""
from __future__ import annotations

import torch
from torch import nn

import _harness as h


def backbone(width: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    cin = 3
    for i, w in enumerate((width, 2 * width, 4 * width, 8 * width, 8 * width)):
        layers += [nn.Conv2d(cin, w, 3, padding=1), nn.ReLU(),
                   nn.Conv2d(w, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        cin = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())


class Probe(nn.Module):
    def __init__(self, width: int, classes: int):
        super().__init__()
        self.backbone = backbone(width)
        for p in self.backbone.parameters():
            p.requires_grad_(False)
        self.head = nn.Sequential(nn.Linear(8 * width, 512), nn.ReLU(), nn.Linear(512, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=128, steps=40, warmup=5)
    p.add_argument("--image-size", type=int, default=96)
    args = p.parse_args()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    torch.backends.cudnn.benchmark = True
    width, size = (4, 32) if args.tiny else (128, args.image_size)
    model = Probe(width, 100).to(ctx.device)
    b, dev = args.batch_size, ctx.device
    batches = h.pool(4, lambda i: ((torch.randn(b, 3, size, size, device=dev),),
                                   torch.randint(0, 100, (b,), device=dev)))
    h.train(ctx, args, "frozen-backbone", model,
            lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), batches, h.classify_loss)


if __name__ == "__main__":
    main()
