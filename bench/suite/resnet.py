"""torchvision ResNet-18 / ResNet-50 on random 224x224 images, batch 64, SGD with momentum.

fp32 by default (TF32 convolutions, torch's default), as torchvision's reference classification
recipe trains unless --amp is given; `--amp bf16` for the mixed-precision variant.
"""
from __future__ import annotations

import torch

import _harness as h


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=64, steps=20, warmup=5)
    p.add_argument("--arch", choices=("resnet18", "resnet34", "resnet50", "resnet101"),
                   default="resnet50")
    p.add_argument("--image-size", type=int, default=224)
    args = p.parse_args()
    tv = h.need_torchvision()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    torch.backends.cudnn.benchmark = True
    size, classes = (32, 10) if args.tiny else (args.image_size, 1000)
    model = getattr(tv.models, args.arch)(weights=None, num_classes=classes).to(ctx.device)
    b, dev = args.batch_size, ctx.device
    batches = h.pool(4, lambda i: ((torch.randn(b, 3, size, size, device=dev),),
                                   torch.randint(0, classes, (b,), device=dev)))
    h.train(ctx, args, args.arch, model,
            lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4),
            batches, h.classify_loss)


if __name__ == "__main__":
    main()
