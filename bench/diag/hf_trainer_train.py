"""A Hugging Face Trainer job of the usual shape: GPT-2 (6 layers x 512, built from a config, no
download), bf16, 2 loader workers, a synthetic token dataset, max_steps."""
import argparse
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--out", default="/tmp/hf-out")
a = p.parse_args()


class Tokens(Dataset):
    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 50257, (256,), generator=g)
        return {"input_ids": ids, "labels": ids}


model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8, n_positions=256))
args = TrainingArguments(output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.batch,
                         bf16=torch.cuda.is_available(), dataloader_num_workers=2,
                         logging_steps=100, save_strategy="no", report_to=[],
                         disable_tqdm=True)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
