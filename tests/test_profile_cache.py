"""Profile cache: hits skip the dry run, keys follow what matters, hostile directories refused."""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import threading

import pytest

from helpers_profile import SCRIPTS
from smartlaunch.errors import PolicyError
from smartlaunch.policy.api import DryRunPolicy, PathsPolicy, Policy
from smartlaunch.profile import cache
from smartlaunch.profile.api import ProfileStatus
from smartlaunch.request import Request
from smartlaunch.store import CacheUnwritable, private_dir

pytestmark = pytest.mark.timeout(120)

POLICY = Policy(dryrun=DryRunPolicy(time_limit_s=60, warmup_steps=1, measure_steps=2))


def tiny(marker, **kw):
    return Request(script=str(SCRIPTS / "tiny_train.py"), script_args=("--marker", str(marker)), **kw)


def starts(marker) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def test_cache_hit_skips_the_dry_run_and_reprofile_forces_one(clean_env, shared_dir):
    marker = shared_dir / "starts.txt"    # the dry run's own writes are thrown away
    env = dict(os.environ)
    results = []

    def launch():
        results.append(cache.profile_entrypoint(tiny(marker), POLICY, gpu=None, gpu_model="cpu",
                                                environ=env))

    # two launches of one job at once: the second waits on the lock, then hits the cache
    threads = [threading.Thread(target=launch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert starts(marker) == 1
    assert sorted(p.cached for p in results) == [False, True]
    first = next(p for p in results if not p.cached)
    assert first.status == ProfileStatus.OK
    again = cache.profile_entrypoint(tiny(marker), POLICY, gpu=None, gpu_model="cpu", environ=env)
    assert again.cached and starts(marker) == 1
    assert dataclasses.replace(again, cached=False) == first
    files = list((clean_env / "home" / ".cache" / "smartlaunch" / "profiles").glob("*.json"))
    assert len(files) == 1  # XDG_CACHE_HOME respected
    forced = cache.profile_entrypoint(tiny(marker, reprofile=True), POLICY, gpu=None,
                                      gpu_model="cpu", environ=env)
    assert not forced.cached and starts(marker) == 2


def test_an_unmeasurable_profile_is_cached_and_reprofile_measures_it_again(clean_env, shared_dir):
    # Given a GPU NVML found, a script that runs on the CPU is UNMEASURABLE (CPU torch here
    # stands for a hidden driver): the next launch of the same job knows it without a dry run.
    marker = shared_dir / "starts.txt"
    env = dict(os.environ)

    def launch(**kw):
        return cache.profile_entrypoint(tiny(marker, **kw), POLICY, gpu="0",
                                        gpu_model="NVIDIA H200", environ=env, real_gpu=True)
    first = launch()
    assert first.status == ProfileStatus.UNMEASURABLE and not first.cached, first.note
    again = launch()
    assert again.cached and starts(marker) == 1
    assert dataclasses.replace(again, cached=False) == first
    forced = launch(reprofile=True)
    assert forced.status == ProfileStatus.UNMEASURABLE and not forced.cached
    assert starts(marker) == 2


def test_key_follows_content_args_and_gpu_model_but_not_visible_devices(clean_env, monkeypatch):
    work = clean_env / "proj"
    shutil.copytree(SCRIPTS / "pkg_train", work)
    (work / "train.py").write_text("print('hi')\n")
    req = Request(script=str(work / "train.py"), script_args=("--lr", "1"))
    env = {"CUDA_VISIBLE_DEVICES": "0"}

    def key(r=req, e=env, model="NVIDIA H200"):
        return cache.profile_key(r, POLICY, gpu_model=model, environ=e)

    monkeypatch.chdir(work)
    base = key()
    assert key(e={"CUDA_VISIBLE_DEVICES": "GPU-5"}) == base
    # the same file however the command line spells it, from the same directory
    for spelling in ("train.py", "./train.py", "../proj/train.py"):
        assert key(r=dataclasses.replace(req, script=spelling)) == base, spelling
    assert key(model="NVIDIA H100 80GB HBM3") != base
    assert key(r=dataclasses.replace(req, script_args=("--lr", "2"))) != base
    (work / "model.py").write_text((work / "model.py").read_text() + "\n# changed\n")
    assert key() != base  # a sibling module the script imports
    changed = key()
    (work / "train.py").write_text("print('hello')\n")
    assert key() != changed
    # -m resolves the module's file through cwd/PYTHONPATH: its content is in the key
    mod = Request(script="pkg_train", module=True)
    k1 = key(r=mod, e={"PYTHONPATH": str(SCRIPTS)})
    monkeypatch.chdir(clean_env)
    copy = clean_env / "pkg_train"
    shutil.copytree(SCRIPTS / "pkg_train", copy)
    (copy / "__main__.py").write_text("print('other')\n")
    assert key(r=mod, e={}) != k1


def _writer(path, n, tag):
    folder = cache.private_dir(cache.Path(path).parent)
    for i in range(n):
        cache.write_json(folder / cache.Path(path).name, {"writer": tag, "i": i, "pad": "x" * 20000})


def test_concurrent_writers_never_leave_a_torn_file(clean_env):
    target = clean_env / "c" / "entry.json"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(target), 40, t)) for t in range(3)]
    for p in procs:
        p.start()
    seen = 0
    while any(p.is_alive() for p in procs):
        data = cache.read_json(target)
        if data is not None:
            assert data["pad"] == "x" * 20000
            seen += 1
    for p in procs:
        p.join()
        assert p.exitcode == 0
    final = json.loads(target.read_text())
    assert final["i"] == 39
    assert not [f for f in target.parent.iterdir() if f.name != "entry.json"], "temp files left"


def test_symlinked_cache_dir_is_refused(clean_env):
    real = clean_env / "elsewhere"
    real.mkdir()
    link = clean_env / "cache-link"
    link.symlink_to(real)
    policy = Policy(paths=PathsPolicy(cache_dir=str(link)))
    with pytest.raises(PolicyError, match="symbolic link"):
        cache.profile_entrypoint(tiny(clean_env / "m"), policy, gpu=None, gpu_model="cpu",
                                 environ=dict(os.environ))
    assert not (clean_env / "m").exists()


def test_group_writable_cache_dir_is_refused_unless_sticky(clean_env):
    shared = clean_env / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PolicyError, match="world-writable"):
        cache.private_dir(shared)
    shared.chmod(0o1777)
    assert cache.private_dir(shared) == shared


def test_planted_symlink_entry_is_not_followed(clean_env):
    folder = cache.private_dir(clean_env / "c")
    secret = clean_env / "secret.json"
    secret.write_text('{"status": "ok"}')
    (folder / "k.json").symlink_to(secret)
    assert cache.read_json(folder / "k.json") is None


def test_cache_root_expands_home_and_prefers_xdg_only_for_the_default(clean_env):
    h = str(clean_env / "h")
    os.mkdir(h)
    env = {"HOME": h, "XDG_CACHE_HOME": "/x"}
    assert str(cache.cache_root(Policy(), env)) == "/x/smartlaunch"
    assert str(cache.cache_root(Policy(), {"HOME": h})) == f"{h}/.cache/smartlaunch"
    custom = Policy(paths=PathsPolicy(cache_dir="~/sl-cache"))
    assert str(cache.cache_root(custom, env)) == f"{h}/sl-cache"


def test_a_cache_under_a_home_that_does_not_exist_is_never_made(clean_env, monkeypatch):
    # HOME=/nonexistent (a service account) made /nonexistent/.cache/... at the root: the
    # cache is then one that cannot be written (the launch measures without it)
    home = clean_env / "nohome"
    monkeypatch.setenv("HOME", str(home))
    root = cache.cache_root(Policy(), {"HOME": str(home)})
    assert root == home / ".cache" / "smartlaunch"
    with pytest.raises(CacheUnwritable, match=f"HOME={home} does not exist"):
        private_dir(root)
    assert not home.exists()
    assert str(cache.cache_root(Policy(), {"HOME": str(home), "XDG_CACHE_HOME": "/x"})) \
        == "/x/smartlaunch"
