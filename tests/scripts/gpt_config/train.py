"""Trains model.GPT on token files, configured by `--key=value` overrides (configurator.py,
executed from the working directory), the way small research trainers are written:
gradient accumulation that skips the all-reduce (`no_sync`) on all but the last micro-step,
a GradScaler (active with float16), DDP when launched with RANK set, data read from
`data/<dataset>/{train,val}.bin` (uint16 tokens) relative to the working directory, and a
checkpoint in out_dir resumed when init_from="resume". Written for smartlaunch's tests.
"""
import contextlib
import os
import time
from array import array

import torch
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig

dataset = "tiny"
out_dir = "out"
init_from = "scratch"
device = "cuda"
dtype = "bfloat16"
backend = "nccl"
compile = False
batch_size = 8
block_size = 64
gradient_accumulation_steps = 4
n_layer, n_head, n_embd = 4, 4, 128
learning_rate = 3e-4
max_iters = 200
log_interval = 10
eval_interval = 100
eval_iters = 5
exec(open("configurator.py").read())

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    gradient_accumulation_steps = max(1, gradient_accumulation_steps // int(os.environ["WORLD_SIZE"]))
else:
    rank = 0
torch.manual_seed(1337 + rank)
device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
autocast = contextlib.nullcontext() if device_type == "cpu" else \
    torch.autocast(device_type=device_type, dtype=ptdtype)


def tokens(split: str) -> torch.Tensor:
    buf = array("H")
    with open(os.path.join("data", dataset, f"{split}.bin"), "rb") as f:
        buf.frombytes(f.read())
    return torch.tensor(buf, dtype=torch.long)


data = {s: tokens(s) for s in ("train", "val")}
vocab_size = int(max(int(data["train"].max()), int(data["val"].max())) + 1)


def get_batch(split: str):
    d = data[split]
    ix = torch.randint(len(d) - block_size - 1, (batch_size,))
    x = torch.stack([d[i:i + block_size] for i in ix])
    y = torch.stack([d[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


config = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer,
                   n_head=n_head, n_embd=n_embd)
model = GPT(config).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
ckpt_path = os.path.join(out_dir, "ckpt.pt")
iter_num = 0
if init_from == "resume" and os.path.exists(ckpt_path):
    ckpt = torch.load(ckpt_path, map_location=device)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    iter_num = ckpt["iter_num"]
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
if compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)
raw = model.module if ddp else model

t0 = time.time()
x, y = get_batch("train")
while iter_num < max_iters:
    for micro in range(gradient_accumulation_steps):
        last = micro == gradient_accumulation_steps - 1
        sync = contextlib.nullcontext() if (last or not ddp) else model.no_sync()
        with sync, autocast:
            _, loss = model(x, y)
            loss = loss / gradient_accumulation_steps
        x, y = get_batch("train")
        scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if rank == 0 and iter_num % log_interval == 0:
        dt = time.time() - t0
        print(f"iter {iter_num}: loss {loss.item() * gradient_accumulation_steps:.4f}, "
              f"{dt * 1000 / log_interval:.1f} ms/iter", flush=True)
        t0 = time.time()
    if rank == 0 and iter_num % eval_interval == 0:
        os.makedirs(out_dir, exist_ok=True)
        torch.save({"model": raw.state_dict(), "optimizer": optimizer.state_dict(),
                    "iter_num": iter_num}, ckpt_path)
if ddp:
    destroy_process_group()
