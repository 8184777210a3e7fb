"""Trial outcomes are cached with the profile: a repeated launch does not re-measure."""
from __future__ import annotations

import dataclasses

from helpers_common import fixture_path

from smartlaunch.vocab import Strategy
from smartlaunch.policy.api import Policy
from smartlaunch.profile.cache import cached_trials
from smartlaunch.request import Request
from smartlaunch.topology.fake import from_json


def test_trial_results_are_reused_until_reprofile(clean_env):
    (clean_env / "train.py").write_text("print('x')\n")
    topo = from_json(fixture_path("h200-nv18-pair"), {})
    request = Request(script="train.py", script_args=("--lr", "1"))
    calls = []

    def runner(strategy, gpus):
        calls.append((strategy, gpus))
        return 100.0 * len(gpus)

    env = {"HOME": str(clean_env / "home"), "XDG_CACHE_HOME": str(clean_env / "cache")}
    single = (Strategy.SINGLE, (0,))
    ddp = (Strategy.DDP, (0, 1))
    run = cached_trials(runner, request, Policy(), topology=topo, environ=env)
    assert (run(*single), run(*ddp)) == (100.0, 200.0)
    again = cached_trials(runner, request, Policy(), topology=topo, environ=env)
    assert (again(*single), again(*ddp)) == (100.0, 200.0)
    assert len(calls) == 2                                  # served from the cache

    # Another link environment or other script arguments are other measurements.
    other_env = cached_trials(runner, request, Policy(), topology=topo,
                              environ={**env, "NCCL_P2P_DISABLE": "1"})
    other_env(*ddp)
    other_args = cached_trials(runner, dataclasses.replace(request, script_args=("--lr", "2")),
                               Policy(), topology=topo, environ=env)
    other_args(*ddp)
    assert len(calls) == 4
    forced = cached_trials(runner, dataclasses.replace(request, reprofile=True), Policy(),
                           topology=topo, environ=env)
    forced(*single)
    assert len(calls) == 5


def test_a_failed_trial_is_not_cached(clean_env):
    (clean_env / "train.py").write_text("")
    topo = from_json(fixture_path("h200-nv18-pair"), {})
    env = {"HOME": str(clean_env / "home"), "XDG_CACHE_HOME": str(clean_env / "cache")}
    results = iter([None, 42.0])
    run = cached_trials(lambda strategy, gpus: next(results), Request(script="train.py"), Policy(),
                        topology=topo, environ=env)
    assert run(Strategy.SINGLE, (0,)) is None and run(Strategy.SINGLE, (0,)) == 42.0
