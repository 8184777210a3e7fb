"""Lightning-style: a LightningModule-like class (training_step, configure_optimizers) and a
hand-written trainer loop that steps the optimizer with a closure (optimizer.step(closure)
runs forward and backward inside the step, as Lightning's automatic optimization does)."""
import common

import torch
from torch import nn


class LitClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = common.model()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class Trainer:
    def __init__(self, max_steps):
        self.max_steps, self.global_step = max_steps, 0

    def fit(self, module, dataloader):
        model = common.wrap(module)
        opt = module.configure_optimizers()
        for idx, batch in common.batches(dataloader, self.max_steps):
            def closure():
                opt.zero_grad()
                loss = module.training_step(batch, idx) if model is module else \
                    nn.functional.cross_entropy(model(batch[0]), batch[1])
                loss.backward()
                return loss
            self.loss = opt.step(closure)
            self.global_step += 1


def main():
    ap = common.parser(__doc__)
    args = ap.parse_args()
    common.init()
    trainer = Trainer(args.steps)
    trainer.fit(LitClassifier(), common.loader(common.data(), args.batch_size))
    print(f"finished after {trainer.global_step} steps: loss {trainer.loss.item():.3f}",
          flush=True)
    common.done()


if __name__ == "__main__":
    main()
