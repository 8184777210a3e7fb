"""A Hugging Face Trainer-style loop (~67M-parameter encoder classifier: 6 layers, 768 wide,
vocab 30,522, 128 tokens), batch 32 of dict inputs, bf16 autocast.

Written the way Trainer-based scripts run: batches are dicts (input_ids, attention_mask,
labels) passed as `model(**batch)`, the model returns a dict holding the loss, and each step
clips the gradient norm and steps a linear warm-up schedule, as Trainer does by default.
Its own loop, not bench/suite/_harness.train: the point is the calling convention.
"""
from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist
from torch import nn

import _harness as h


class EncoderForClassification(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int, labels: int):
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.norm = nn.LayerNorm(d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, activation="gelu",
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.classifier = nn.Linear(d, labels)

    def forward(self, input_ids, attention_mask=None, labels=None) -> dict:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.norm(self.word(input_ids) + self.pos(pos))
        pad = None if attention_mask is None else attention_mask == 0
        logits = self.classifier(self.encoder(x, src_key_padding_mask=pad)[:, 0])
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.float(), labels)
        return out


def main() -> None:
    p = h.parser(__doc__.splitlines()[0], batch=32, steps=60, warmup=5)
    args = p.parse_args()
    if args.scaling:
        p.error("--scaling: this script runs its own loop (the point is the calling convention), "
                "not the harness's, so it has no scaling windows")
    ctx = h.setup()
    torch.manual_seed(args.seed + ctx.rank)
    vocab, d, layers, heads, seq = (100, 16, 1, 2, 8) if args.tiny else (30522, 768, 6, 12, 128)
    model = EncoderForClassification(vocab, d, layers, heads, seq, 3).to(ctx.device)
    n_params = sum(q.numel() for q in model.parameters())
    if ctx.world > 1:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[ctx.local_rank] if ctx.cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0)
    total = args.warmup + args.steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, total // 10)))
    b, dev = args.batch_size, ctx.device

    def make(i) -> dict:
        mask = torch.ones(b, seq, dtype=torch.long, device=dev)
        mask[:, seq - seq // 4:] = 0                       # a padded tail, as tokenizers leave
        return {"input_ids": torch.randint(0, vocab, (b, seq), device=dev),
                "attention_mask": mask, "labels": torch.randint(0, 3, (b,), device=dev)}

    batches = [make(i) for i in range(4)]
    amp = h.autocast(ctx, args.amp, "bf16")
    model.train()

    def training_step(inputs: dict) -> torch.Tensor:
        with amp:
            loss = model(**inputs)["loss"]
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    loss = None
    for i in range(args.warmup):
        loss = training_step(batches[i % 4])
    if ctx.cuda:
        torch.cuda.synchronize()
    if ctx.world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = training_step(batches[i % 4])
    if ctx.cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if ctx.rank == 0 and args.steps > 0:
        per_rank = b * args.steps / seconds
        print(f"model=hf-style-encoder params={n_params} batch={b} loss={float(loss):.4f}",
              flush=True)
        print(f"throughput: samples/s={per_rank * ctx.world:.1f} per_rank={per_rank:.1f} "
              f"world={ctx.world} step_ms={seconds / args.steps * 1e3:.3f}", flush=True)
    if ctx.world > 1:
        del training_step, model, opt, sched
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
