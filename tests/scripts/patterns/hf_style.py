"""Hugging Face Trainer-style: a data set of dicts, collated into dict batches
(input_ids, attention_mask, labels); `outputs = model(**batch)` and the loss read from the
output object, as a causal LM's."""
from dataclasses import dataclass

import common

import torch
from torch import nn
from torch.utils.data import Dataset

VOCAB, SEQ = 128, 16


@dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.mlp = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
        self.head = nn.Linear(64, VOCAB)

    def forward(self, input_ids, attention_mask=None, labels=None):
        h = self.embed(input_ids)
        h = h + self.mlp(h)
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        logits = self.head(h)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB),
                                               labels[:, 1:].reshape(-1))
        return Output(loss=loss, logits=logits)


class Texts(Dataset):
    def __init__(self, n=8192):
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(3))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.ids[i].clone()}


def main():
    ap = common.parser(__doc__)
    args = ap.parse_args()
    common.init()
    torch.manual_seed(0)
    model = common.wrap(TinyLM())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _, batch in common.batches(common.loader(Texts(), args.batch_size), args.steps):
        outputs = model(**batch)
        outputs.loss.backward()
        opt.step()
        opt.zero_grad()
    print(f"finished: loss {outputs.loss.item():.3f}", flush=True)
    common.done()


if __name__ == "__main__":
    main()
