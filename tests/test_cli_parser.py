"""Parser parity: smartlaunch's torchrun configuration equals torchrun's own."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch.distributed.run as torchrun

from smartlaunch.cli import build_parser, parse
from helpers_common import own_lines

# (smartlaunch's own options, torchrun command line). smartlaunch gets own + torchrun argv;
# torchrun gets the torchrun argv alone. Both must yield the same LaunchConfig and command.
CASES = [
    ([], ["train.py"]),
    ([], ["--nproc-per-node", "2", "train.py", "--lr", "0.1"]),
    ([], ["--nproc_per_node=4", "train.py"]),
    ([], ["--standalone", "--nproc-per-node", "2", "train.py"]),
    ([], ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
          "--master-port", "29501", "train.py"]),
    ([], ["--nnodes", "1:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:29400",
          "--rdzv-id", "job42", "train.py"]),
    ([], ["--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0",
          "--rdzv-conf", "timeout=30,read_timeout=60", "train.py"]),
    ([], ["--max-restarts", "3", "train.py"]),
    ([], ["--monitor-interval", "1", "train.py"]),
    ([], ["--log-dir", "/tmp/sl-logs", "--redirects", "3", "--tee", "1", "train.py"]),
    ([], ["-r", "1:1,0:2", "train.py"]),
    ([], ["-t", "3", "train.py"]),
    ([], ["-m", "json.tool", "in.json"]),
    ([], ["--no-python", "echo", "hello"]),
    ([], ["--run-path", "train.py"]),
    ([], ["--role", "trainer", "train.py"]),
    ([], ["--start-method", "fork", "train.py"]),
    ([], ["--local-ranks-filter", "0", "train.py"]),
    ([], ["--nproc-per-node", "auto", "train.py"]),
    ([], ["--max_restarts=1", "--nnodes=1", "train.py", "--epochs", "3", "--explain"]),
    (["--strategy", "ddp", "--explain"], ["--nproc-per-node", "2", "train.py"]),
    (["--explain=json", "--policy", "p.yaml"], ["--nproc-per-node", "2", "train.py", "a", "b"]),
    (["--explain", "json", "--reprofile"], ["--standalone", "train.py", "--explain"]),
    (["--strategy=single", "--no-wait"], ["--master-port", "1234", "--master-addr",
                                          "localhost", "train.py"]),
    (["--each", "--lr 0.1", "--each", "--lr 0.2"], ["--nproc-per-node", "2", "train.py"]),
    ([], ["--signals-to-handle", "SIGTERM,SIGUSR1", "train.py"]),
]


def _config(ns):
    saved = dict(os.environ)
    try:  # config_from_args may set OMP_NUM_THREADS; keep the test process unchanged
        config, cmd, args = torchrun.config_from_args(ns)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    specs = dict(vars(fields["logs_specs"]))
    if os.path.basename(str(specs.get("_root_log_dir", ""))).startswith("torchelastic_"):
        specs["_root_log_dir"] = "<fresh temp dir>"  # mkdtemp'd anew by each parse
    fields["logs_specs"] = (type(fields["logs_specs"]).__name__, specs)
    return fields, cmd, list(args)


@pytest.mark.parametrize("own,argv", CASES, ids=[" ".join(o + a) for o, a in CASES])
def test_torchrun_config_parity(clean_env, own, argv):
    (clean_env / "train.py").write_text("print('hi')\n")
    known = build_parser()._option_string_actions
    for tok in argv:
        if not tok.startswith("-"):
            break                      # the script: what follows is the script's own
        name = tok.split("=")[0]
        if name.startswith("--") and name not in known:
            pytest.skip(f"{name} is not a torchrun option in this torch version")
    request, _ = parse(own + argv, environ={})
    ours = _config(request.torchrun_args)
    theirs = _config(torchrun.parse_args(argv))
    assert ours == theirs


def test_pet_environment_variables_are_honoured(clean_env, monkeypatch):
    (clean_env / "train.py").write_text("")
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_MAX_RESTARTS", "2")
    request, given = parse(["--strategy", "ddp", "train.py"], environ=os.environ)
    assert request.torchrun_args.nproc_per_node == "3"
    assert request.torchrun_args.max_restarts == 2
    assert request.max_gpus == 3 and "nproc_per_node" in given
    assert _config(request.torchrun_args) == _config(torchrun.parse_args(["train.py"]))


def test_own_options_and_script_args_are_separated(clean_env):
    (clean_env / "train.py").write_text("")
    request, given = parse(["--explain", "--nproc-per-node", "2", "train.py", "--explain",
                            "--strategy", "x"], environ={})
    assert request.explain == "text"
    assert request.strategy == "auto"
    assert request.script_args == ("--explain", "--strategy", "x")
    assert request.max_gpus == 2
    assert {"nproc_per_node", "explain"} <= given


def test_each_variants_are_split_like_a_shell(clean_env):
    (clean_env / "train.py").write_text("")
    request, _ = parse(["--each", "--lr 0.1 --name 'a b'", "--each", "--lr=2", "train.py"], {})
    assert request.variants == (("--lr", "0.1", "--name", "a b"), ("--lr=2",))


def _run_cli(args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "smartlaunch.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,needle", [
    (["--frobnicate", "train.py"], "unrecognized arguments: --frobnicate"),
    (["missing.py"], "training script not found: missing.py"),
    (["-m", "no_such_module_xyz"], "module not found: no_such_module_xyz"),
    (["--no-python", "no-such-program-xyz"], "program not found: no-such-program-xyz"),
    (["--strategy", "fastest", "train.py"], "invalid choice: 'fastest'"),
    (["--nproc-per-node", "0", "train.py"], "--nproc-per-node 0 must be at least 1"),
    (["--nproc-per-node", "two", "train.py"], "--nproc-per-node 'two' is not a number"),
    (["--strategy", "ddp", "--each", "--lr 1", "train.py"], "cannot be combined"),
])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(clean_env, args, needle):
    marker = clean_env / "started"
    (clean_env / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    r = _run_cli(args, clean_env)
    assert r.returncode == 2, r.stderr
    lines = own_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("smartlaunch: error: "), r.stderr
    assert needle in lines[0]
    assert not marker.exists()


def test_help_shows_smartlaunchs_options_first_and_torchruns_common_ones(clean_env):
    r = _run_cli(["--help"], clean_env)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    out = r.stdout
    assert out.index("smartlaunch options:") < out.index("--strategy") < out.index(
        "\ntorchrun options") < out.index("--nproc-per-node")
    assert len(out.splitlines()) <= 60
    assert "--rdzv-backend" not in out and "smartlaunch --help-torchrun" in out
    # Hidden from the short help, torchrun's options still parse (the parity cases above).
    full = _run_cli(["--help-torchrun"], clean_env)
    assert full.returncode == 0
    every = {s for a in torchrun.get_args_parser()._actions for s in a.option_strings}
    assert every <= set(full.stdout.replace(",", " ").split()), every - set(full.stdout.split())
    assert full.stdout.index("smartlaunch options:") < full.stdout.index("--rdzv-backend")


@pytest.mark.parametrize("module", ["smartlaunch.cli", "smartlaunch.node_cli"])
def test_version_names_smartlaunch_and_torch(clean_env, module):
    import tomllib
    import torch
    import smartlaunch
    from helpers_common import REPO
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert smartlaunch.__version__ == version
    r = subprocess.run([sys.executable, "-m", module, "--version"], cwd=clean_env,
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, f"smartlaunch {version} (torch {torch.__version__})\n")
    assert own_lines(r.stderr) == []
