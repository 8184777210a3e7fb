"""Helpers for the profile area's tests: test scripts, the GPT trainer's workdir, expected counts."""
from __future__ import annotations

import importlib.util
import random
import shutil
import sys
from array import array
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"

# gpt_config/train.py takes --key=value overrides (its configurator.py); a tiny CPU run with
# two micro-steps per step (the first under DDP's no_sync).
GPT_ARGS = (
    "--dataset=tiny", "--device=cpu", "--compile=False", "--dtype=float32", "--backend=gloo",
    "--eval_interval=100000", "--eval_iters=1", "--log_interval=100000", "--max_iters=1000",
    "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
    "--gradient_accumulation_steps=2", "--out_dir=gpt-out",
)
GPT_VOCAB = 65


def gpt_workdir(root: Path) -> Path:
    """train.py reads configurator.py and data/<dataset>/ relative to its cwd: build one."""
    work = root / "gpt_config"
    shutil.copytree(SCRIPTS / "gpt_config", work)
    data = work / "data" / "tiny"
    data.mkdir(parents=True)
    rng = random.Random(0)
    for split, n in (("train", 4096), ("val", 512)):
        toks = array("H", (rng.randrange(GPT_VOCAB) for _ in range(n - 1)))
        toks.append(GPT_VOCAB - 1)           # the vocabulary train.py infers is exactly 65
        with open(data / f"{split}.bin", "wb") as f:
            toks.tofile(f)
    return work


def gpt_expected() -> tuple[int, int]:
    """(trainable params, grad bytes) of the tiny GPT, from its own model definition."""
    mod = load(SCRIPTS / "gpt_config" / "model.py", "gpt_config_model_for_tests")
    cfg = mod.GPTConfig(vocab_size=GPT_VOCAB, block_size=32, n_layer=2, n_head=2, n_embd=32)
    return counts(mod.GPT(cfg))


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def counts(model, trainable_only: bool = True) -> tuple[int, int]:
    ps = [p for p in model.parameters() if p.requires_grad or not trainable_only]
    return sum(p.numel() for p in ps), sum(p.numel() * p.element_size() for p in ps)
