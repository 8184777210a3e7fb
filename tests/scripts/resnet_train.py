"""ResNet-18 image-classification training on synthetic data, torchrun-style.

Uses torchvision.models.resnet18 when torchvision is importable (the GPU machine); otherwise a
local definition with the same architecture (torchvision cannot be installed on the CPU CI
machine). Runs on cuda:LOCAL_RANK when CUDA is available, wraps in DDP under torchrun.

    torchrun --nproc-per-node 2 resnet_train.py --batch-size 64 --steps 200
"""
import argparse
import os

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def build_model(num_classes=1000) -> nn.Module:
    try:
        import torchvision
        return torchvision.models.resnet18(num_classes=num_classes)
    except ImportError:
        return ResNet18(num_classes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--num-classes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=1000)
    args = ap.parse_args()
    distributed = "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if distributed:
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    model = build_model(args.num_classes).to(device).to(memory_format=torch.channels_last)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.index is not None else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    y = torch.randint(0, args.num_classes, (args.batch_size,), device=device)
    for _ in range(args.steps):
        loss = nn.functional.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if distributed:
        del model, opt, loss           # free the reducer first (see examples/train.py)
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
