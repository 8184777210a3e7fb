"""torchvision ViT-L/16 (~304M parameters) on random 224x224 images, batch 16, AdamW, bf16
autocast (ViTs are trained in mixed precision; fp32 would double the step for nothing).

The largest model of the suite: 1.2 GB of fp32 gradients per step to all-reduce.
"""
from __future__ import annotations

import torch

import _harness as h


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=16, steps=10, warmup=3)
    p.add_argument("--arch", choices=("vit_b_16", "vit_l_16", "vit_h_14"), default="vit_l_16")
    args = p.parse_args()
    tv = h.need_torchvision()
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    if args.tiny:
        size, classes = 32, 10
        model = tv.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                            hidden_dim=32, mlp_dim=64, num_classes=classes)
    else:
        size, classes = 224, 1000
        model = getattr(tv.models, args.arch)(weights=None)
    model = model.to(ctx.device)
    b, dev = args.batch_size, ctx.device
    batches = h.pool(4, lambda i: ((torch.randn(b, 3, size, size, device=dev),),
                                   torch.randint(0, classes, (b,), device=dev)))
    h.train(ctx, args, args.arch, model,
            lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.05),
            batches, h.classify_loss, amp_default="bf16")


if __name__ == "__main__":
    main()
