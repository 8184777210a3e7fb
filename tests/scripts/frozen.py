"""Fine-tuning with a frozen backbone: only the head trains (requires_grad False elsewhere),
and the optimizer is given every parameter, as many fine-tuning scripts do."""
import torch
from torch import nn


def build_model() -> nn.Module:
    model = nn.Sequential(
        nn.Sequential(nn.Linear(48, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 128)),
        nn.Linear(128, 5),
    )
    for p in model[0].parameters():
        p.requires_grad_(False)
    return model


def main():
    torch.manual_seed(0)
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(10_000):
        x, y = torch.randn(24, 48), torch.randint(0, 5, (24,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
