"""What the user asked for, as parsed from the command line (the CLI's output)."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from smartlaunch.errors import UsageError


@dataclass(frozen=True)
class Request:
    strategy: str = "auto"                       # one of vocab.STRATEGY_CHOICES
    max_gpus: int | None = None                  # --nproc-per-node N; None: not given
    script: str = ""                             # script path, module name, or program
    script_args: tuple[str, ...] = ()
    module: bool = False                         # -m
    no_python: bool = False                      # --no-python
    variants: tuple[tuple[str, ...], ...] = ()   # --each / --each-file: script args per job
    explain: str | None = None                   # None | "text" | "json"
    policy_path: str | None = None
    reprofile: bool = False
    no_wait: bool = False
    debug: bool = False
    quiet: bool = False                          # --quiet: no decision line
    nnodes: str = "1"
    nnodes_from: str = ""                        # who set nnodes when the user did not: "Slurm"
    # torchrun's parsed namespace (smartlaunch options removed): the launch API's input.
    torchrun_args: argparse.Namespace | None = field(default=None, compare=False, repr=False)

    @property
    def multi_node(self) -> bool:
        return self.nnodes not in ("1", "1:1")

    def nnodes_words(self) -> str:
        """Where the node count came from, for messages: "--nnodes 2", "2 nodes from Slurm"."""
        return f"{self.nnodes} nodes from {self.nnodes_from}" if self.nnodes_from else \
            f"--nnodes {self.nnodes}"

    def cpu_ranks(self) -> tuple[int, str]:
        """(processes, where the number came from) for ranks on the CPU, as torchrun counts
        them: --nproc-per-node N, `cpu` or `auto` (the CPUs this process may run on), 1 by
        default. UsageError for `gpu` (torchrun fails the same: CUDA is not available)."""
        raw = str(getattr(self.torchrun_args, "nproc_per_node", "1"))
        if self.max_gpus is not None:
            return self.max_gpus, f"user: --nproc-per-node {self.max_gpus}"
        if raw in ("cpu", "auto"):
            return len(os.sched_getaffinity(0)), f"user: --nproc-per-node {raw}"
        if raw == "gpu":
            raise UsageError("--nproc-per-node gpu on a node without GPUs (torchrun fails the "
                             "same: CUDA is not available); give the number of processes per "
                             "node, e.g. --nproc-per-node 1")
        return 1, "torchrun's default: --nproc-per-node 1"

    def worker_command(self) -> tuple[str, ...]:
        """The worker's command as the worker hook takes it: `[--module | --no-python] SCRIPT
        ARGS`."""
        flags = ("--no-python",) if self.no_python else ("--module",) if self.module else ()
        return (*flags, self.script, *self.script_args)
