"""Batch and work per optimizer step: every input shape, accumulation, world-size reads."""
from __future__ import annotations

import collections
import dataclasses
import os

import pytest
import torch

from helpers_profile import GPT_ARGS, SCRIPTS, gpt_workdir
from smartlaunch.policy.api import DryRunPolicy, Policy
from smartlaunch.profile.api import ProfileStatus
from smartlaunch.profile.inputs import leading_dim
from smartlaunch.profile.runner import run_dry_run
from smartlaunch.request import Request

pytestmark = pytest.mark.timeout(120)

POLICY = Policy(dryrun=DryRunPolicy(time_limit_s=60, warmup_steps=1, measure_steps=3,
                                   measure_seconds=0.0))
X = torch.zeros(8, 16)
MASK = torch.ones(8, 16)


@dataclasses.dataclass
class Batch:
    name: str
    features: torch.Tensor


class Encoding(collections.UserDict):   # the shape of transformers.BatchEncoding
    pass


Pair = collections.namedtuple("Pair", "x y")


@pytest.mark.parametrize("args, kwargs", [
    ((X,), {}),                                         # model(x)
    ((), {"input_ids": X, "attention_mask": MASK}),     # model(**inputs)
    ((torch.tensor(3.0),), {"x": X}),                   # a scalar first, then the batch
    (({"input_ids": X},), {}),                          # model(batch_dict)
    (([X, MASK],), {}),                                 # model([x, mask])
    ((Pair(X, MASK),), {}),                             # a named tuple
    ((Encoding(input_ids=X),), {}),                     # BatchEncoding-like mapping
    ((), dict(Encoding(pixel_values=X))),               # ... unpacked as **inputs
    ((Batch("b", X),), {}),                             # a dataclass batch
    (("text", None, [Batch("b", X)]), {}),              # nested, after non-tensors
], ids=["positional", "kwargs", "scalar-first", "dict", "list", "namedtuple", "mapping",
        "mapping-kwargs", "dataclass", "nested"])
def test_batch_found_in_every_input_shape(args, kwargs):
    assert leading_dim(args, kwargs) == 8


def test_no_tensor_no_batch():
    assert leading_dim(("a", 1, None), {"flag": True}) is None
    assert leading_dim((torch.tensor(1.0),), {}) is None


def dry(*args, environ=None):
    env = dict(os.environ if environ is None else environ)
    req = Request(script=str(SCRIPTS / "batch_shapes.py"), script_args=tuple(args))
    prof = run_dry_run(req, POLICY, gpu=None, environ=env)
    assert prof.status == ProfileStatus.OK, prof.note
    return prof


@pytest.mark.parametrize("shape", ["kwargs", "mapping", "dataclass"])
def test_dry_run_reads_the_batch_of_a_real_script(clean_env, shape):
    prof = dry("--input", shape, "--batch", "8")
    assert (prof.batch_size, prof.micro_batch_size, prof.micro_batches) == (8, 8, 1)
    assert prof.reads_world_size is None and not prof.work_depends_on_world_size
    assert prof.forward_s and prof.backward_s and prof.optimizer_s is not None


def test_accumulation_counts_every_micro_batch(clean_env):
    prof = dry("--input", "list", "--batch", "8", "--accum", "4")
    # one optimizer step processes 4 x 8 samples; the no_grad evaluation call is not one
    assert (prof.batch_size, prof.micro_batch_size, prof.micro_batches) == (32, 8, 4)
    assert prof.forward_s + prof.backward_s <= prof.step_time_s * 1.05


def test_world_size_read_by_the_script_is_recorded(clean_env):
    prof = dry("--batch", "8", "--accum", "4", "--world-size-read", "env")
    assert prof.batch_size == 32
    assert prof.reads_world_size.startswith("batch_shapes.py:")
    assert "WORLD_SIZE" in prof.reads_world_size and prof.work_depends_on_world_size


def test_world_size_read_without_accumulation_is_recorded_but_sizes_nothing(clean_env):
    prof = dry("--batch", "8", "--world-size-read", "env")
    assert prof.reads_world_size.startswith("batch_shapes.py:")
    assert prof.micro_batches == 1 and not prof.work_depends_on_world_size


def test_world_size_asked_only_by_torch_is_not_the_script_s(clean_env):
    prof = dry("--batch", "8", "--world-size-read", "sampler")
    assert prof.reads_world_size is None


def test_gpt_trainer_accumulation_and_world_size(clean_env, monkeypatch):
    work = gpt_workdir(clean_env)
    monkeypatch.chdir(work)
    args = [a for a in GPT_ARGS if not a.startswith(("--batch_size", "--gradient_acc"))]
    args += ["--batch_size=8", "--gradient_accumulation_steps=4"]
    req = Request(script=str(work / "train.py"), script_args=tuple(args))
    prof = run_dry_run(req, POLICY, gpu=None,
                       environ=dict(os.environ, SMARTLAUNCH_DRYRUN_CPU_SHIM="1"))
    assert prof.status == ProfileStatus.OK, prof.note
    assert (prof.batch_size, prof.micro_batch_size, prof.micro_batches) == (32, 8, 4)
    # train.py: gradient_accumulation_steps // int(os.environ["WORLD_SIZE"])
    assert prof.reads_world_size.startswith("train.py:") and prof.work_depends_on_world_size
