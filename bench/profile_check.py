"""The dry run's device-time profile against each script's own timing (issue 15, goal: within 5%).

    python bench/profile_check.py [--cases mlp,lstm,conv,accum,hf] [--own-steps 300] [--out FILE]

For each case, three runs of the same workload script (written to a temp dir):
  own       the script alone, timing itself: sync, N steps, sync (after 30 warm-up steps)
  window    the dry run, window complete (5 warm-up + 100 measured steps)
  cut       the dry run asked for 1000 steps, the script ends after 40: the window is cut
            short by the script's own end (before issue 15 this fell back to host intervals)
Reported: step ms of each, their ratio to `own`, forward/backward/optimizer ms of the window.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

WORKLOAD = r'''
import sys, time, torch
from torch import nn
model_name, steps, own = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "own"
dev = "cuda" if torch.cuda.is_available() else "cpu"
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
torch.manual_seed(0)
micro = 1
if model_name == "mlp":        # issue 15's wide MLP: 134M parameters, batch 16, ~4 ms
    model = nn.Sequential(nn.Linear(8192, 8192), nn.ReLU(), nn.Linear(8192, 8192))
    make = lambda: (torch.randn(16, 8192, device=dev),)
elif model_name == "lstm":     # launch-bound: small kernels, GPU partly idle
    model = nn.LSTM(256, 256, num_layers=2, batch_first=True)
    make = lambda: (torch.randn(32, 64, 256, device=dev),)
elif model_name == "conv":     # compute-bound conv net with BatchNorm
    layers, c = [], 3
    for w in (64, 128, 256, 256):
        layers += [nn.Conv2d(c, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2)]
        c = w
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(256 * 4 * 4, 10))
    make = lambda: (torch.randn(128, 3, 64, 64, device=dev),)
else:                          # accumulation: 4 micro-batches of 8 per optimizer step
    model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096))
    make = lambda: (torch.randn(8, 4096, device=dev),)
    micro = 4
model = model.to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
def step():
    for _ in range(micro):
        out = model(*make())
        out = out[0] if isinstance(out, tuple) else out
        (out.float().square().mean() / micro).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
if own:
    for _ in range(min(30, steps)):
        step()
    sync(); t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    print(f"OWN {(time.perf_counter() - t0) / steps * 1e3:.4f}")
else:
    for _ in range(steps):
        step()
'''

# A Hugging Face Trainer job (model(**inputs), dict batches, accumulation 2 x batch 8): only
# the dry run, to check the batch it reads; the Trainer does not time itself comparably.
HF = r'''
import sys, tempfile, torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
cfg = BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=1024, num_labels=2)
class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 100000
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 1000, (64,), generator=g),
                "attention_mask": torch.ones(64, dtype=torch.long), "labels": i % 2}
args = TrainingArguments(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=8,
                         gradient_accumulation_steps=2, max_steps=int(sys.argv[2]),
                         logging_strategy="no", save_strategy="no", report_to=[],
                         disable_tqdm=True)
Trainer(model=BertForSequenceClassification(cfg), args=args, train_dataset=Data()).train()
'''


def run(cmd, env) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def case(name: str, tmp: Path, env: dict, own_steps: int) -> dict:
    script = tmp / ("hf.py" if name == "hf" else "workload.py")
    own = None if name == "hf" else \
        run([sys.executable, str(script), name, str(own_steps), "own"], env)
    own_ms = float(own.stdout.split("OWN ")[1]) if own and "OWN " in own.stdout else None
    row = {"case": name, "own_ms": own_ms,
           "own_err": own.stderr[-300:] if own and own_ms is None else ""}
    for kind, measure, steps in (("window", 100, 100000), ("cut", 1000, 40)):
        out = tmp / f"{name}-{kind}.json"
        r = run([sys.executable, "-m", "smartlaunch.profile.dryrun", "--out", str(out),
                 "--warmup", "5", "--measure", str(measure), str(script), name, str(steps), "-"],
                env)
        data = json.loads(out.read_text()) if out.exists() else {}
        step = data.get("step_time_s")
        row[kind] = {
            "step_ms": step * 1e3 if step else None,
            "vs_own": step * 1e3 / own_ms if step and own_ms else None,
            "steps": data.get("steps_measured"), "cut_short": data.get("window_cut_short"),
            "timing": data.get("timing"), "batch": data.get("batch_size"),
            "micro_batches": data.get("micro_batches"),
            **{k: data[k] * 1e3 for k in ("forward_s", "backward_s", "optimizer_s") if data.get(k)},
            "rc": r.returncode, "err": r.stderr[-300:] if r.returncode else "",
        }
    return row


def measurement(r: dict) -> dict:
    """One row of --out's list as a measurement of the common format (bench/_record.py)."""
    figures = {"own_ms": r["own_ms"]}
    for kind in ("window", "cut"):
        k = r.get(kind) or {}
        figures.update({f"{kind}_step_ms": k.get("step_ms"), f"{kind}_vs_own": k.get("vs_own"),
                        f"{kind}_steps": k.get("steps"), f"{kind}_cut_short": k.get("cut_short")})
    w = r.get("window") or {}
    figures.update({f"{x}_ms": w.get(f"{x}_s") for x in ("forward", "backward", "optimizer")},
                   batch=w.get("batch"), micro_batches=w.get("micro_batches"),
                   timing=w.get("timing"))
    m = {"conditions": {"case": r["case"]}, "figures": figures}
    errs = [e for e in (r.get("own_err"), *((r.get(k) or {}).get("err") for k in ("window", "cut")))
            if e]
    if errs:
        m["error"] = errs[0].strip().splitlines()[-1][:300]
    return m


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: main(argv) with --out into a temporary file unless given, then
    one measurement per case."""
    argv = list(argv)
    if "--out" not in argv:
        argv += ["--out", tempfile.mkstemp(prefix="profile-check-", suffix=".json")[1]]
    main(argv)
    return [measurement(r) for r in json.loads(Path(argv[argv.index("--out") + 1]).read_text())]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="mlp,lstm,conv,accum,hf")
    ap.add_argument("--out", default=None)
    ap.add_argument("--own-steps", type=int, default=300)
    args = ap.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "workload.py").write_text(WORKLOAD)
        (Path(tmp) / "hf.py").write_text(HF)
        for name in args.cases.split(","):
            rows.append(case(name, Path(tmp), env, args.own_steps))
            r = rows[-1]
            print(json.dumps(r), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print("\n| case | own ms | window ms (×own) | cut-short ms (×own, steps) | fwd/bwd/opt ms | batch (micro) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        w, c = r["window"], r["cut"]
        f = lambda x: f"{x:.3f}" if x else "??"   # noqa: E731
        g = lambda x: f"{x:.3f}" if x else "??"   # noqa: E731
        print(f"| {r['case']} | {f(r['own_ms'])} | {f(w['step_ms'])} ({g(w['vs_own'])}) | "
              f"{f(c['step_ms'])} ({g(c['vs_own'])}, {c['steps']}) | "
              f"{f(w.get('forward_s'))}/{f(w.get('backward_s'))}/{f(w.get('optimizer_s'))} | "
              f"{w.get('batch')} ({w.get('micro_batches')}) |")


if __name__ == "__main__":
    main()
