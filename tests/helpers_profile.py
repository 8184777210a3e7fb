"""Helpers for the profile area's tests: test scripts, nanoGPT's workdir, expected counts."""
from __future__ import annotations

import importlib.util
import pickle
import shutil
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"

# nanoGPT's train.py takes --key=value overrides (its configurator.py); a tiny CPU run.
NANOGPT_ARGS = (
    "--dataset=tiny", "--device=cpu", "--compile=False", "--dtype=float32", "--backend=gloo",
    "--eval_interval=100000", "--eval_iters=1", "--log_interval=100000", "--max_iters=1000",
    "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
    "--gradient_accumulation_steps=1", "--out_dir=nanogpt-out",
)
NANOGPT_VOCAB = 65


def nanogpt_workdir(root: Path) -> Path:
    """nanoGPT reads configurator.py and data/<dataset>/ relative to its cwd: build one."""
    work = root / "nanogpt"
    shutil.copytree(SCRIPTS / "nanogpt", work)
    data = work / "data" / "tiny"
    data.mkdir(parents=True)
    import numpy as np
    rng = np.random.default_rng(0)
    for split, n in (("train", 4096), ("val", 512)):
        rng.integers(0, NANOGPT_VOCAB, n, dtype=np.uint16).tofile(data / f"{split}.bin")
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": NANOGPT_VOCAB}, f)
    return work


def nanogpt_expected() -> tuple[int, int]:
    """(trainable params, grad bytes) of the tiny nanoGPT, from its own model definition."""
    mod = load(SCRIPTS / "nanogpt" / "model.py", "nanogpt_model_for_tests")
    cfg = mod.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, bias=False,
                        vocab_size=NANOGPT_VOCAB, dropout=0.0)
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
