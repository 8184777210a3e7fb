#!/usr/bin/env python3
"""The between-node measurement on GPUs (issue 28): two "nodes" on one GPU host.

Each node is a launcher that sees half of the host's GPUs (CUDA_VISIBLE_DEVICES) and its own
NCCL host id (NCCL_HOSTID, so NCCL treats the other half as another host and goes through its
network transport: sockets on loopback, NCCL_IB_DISABLE=1), its own cache and lease directory.
The rendezvous is c10d on 127.0.0.1; node 0 hosts it (`--rdzv-conf is_host=...`, since both
nodes would otherwise take the loopback endpoint as their own).

Per script, one after another, never two jobs at once:
  decide   smartlaunch --explain=json --nnodes 2 on both nodes (the deciding node dry-runs the
           script and measures the all-reduce between the nodes through NCCL);
  torchrun the same job on both nodes (world 2 x G) and on one node (world G): the options the
           decision weighs, measured;
  launch   smartlaunch --nnodes 2 for real (what it runs, and at what rate).
Regret = best measured option / the chosen option's measured rate - 1.

    python bench/multinode_gpu.py --scripts gpt-124m-b8,wide-mlp-b16 --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

from smartlaunch.worker_env import free_port

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 150.0
STEPS = {"gpt-124m-b8": (10, 60), "wide-mlp-b16": (20, 300), "embbag-b4096": (20, 250),
         "bn-convnet-b64": (20, 300), "gpt-350m-b4": (5, 30)}


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


class Nodes:
    def __init__(self, root: Path, gpus: int):
        self.root, self.half = root, gpus // 2
        self.base = common.child_env(dict(os.environ), "sockets")
        self.base.pop("NCCL_SHM_DISABLE", None)      # within a node: host memory
        self.base.update(NCCL_IB_DISABLE="1", NCCL_SOCKET_IFNAME="lo",
                         PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                  os.environ.get("PYTHONPATH")])))

    def env(self, k: int, label: str) -> dict[str, str]:
        home = self.root / label / f"node{k}"
        home.mkdir(parents=True, exist_ok=True)
        gpus = range(k * self.half, (k + 1) * self.half)
        return {**self.base, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
                "NCCL_HOSTID": f"smartlaunch-bench-node{k}", "HOME": str(home),
                "XDG_CACHE_HOME": str(home / "cache"), "SMARTLAUNCH_LEASE_DIR": str(home / "leases")}

    def both(self, label: str, launcher: list[str], args: list[str], nnodes: int = 2) -> dict:
        """Starts the launcher on nnodes nodes at once; waits for all; their outputs."""
        port = free_port()
        procs, t0 = [], time.monotonic()
        for k in range(nnodes):
            rdzv = ["--nnodes", str(nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    f"127.0.0.1:{port}", "--rdzv-id", f"{label}-{port}", "--rdzv-conf",
                    f"is_host={'true' if k == 0 else 'false'},join_timeout=120"]
            log = open(self.root / f"{label}-node{k}.log", "w+")
            procs.append((subprocess.Popen([*launcher, *rdzv, *args], env=self.env(k, label),
                                           stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True, cwd=REPO), log))
        out = {"label": label, "rc": [], "output": []}
        for p, log in procs:
            try:
                rc = p.wait(max(1.0, TIMEOUT_S - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                rc = p.wait()
            log.seek(0)
            out["rc"].append(rc)
            out["output"].append(log.read())
            log.close()
        out["wall_s"] = time.monotonic() - t0
        return out


def script_args(script: str, steps: int | None = None) -> list[str]:
    e = common.entry(script)
    w, s = STEPS.get(script, (e.warmup, e.steps))
    return [e.script, *e.args, "--warmup", str(w), "--steps", str(steps or s)]


def rate(res: dict) -> float | None:
    got = [common.parse_throughput(o) for o in res["output"]]
    got = [g["samples_per_s"] for g in got if g]
    return max(got) if got else None


def one(nodes: Nodes, script: str, out: dict) -> dict:
    sl = list(common.SMARTLAUNCH)
    tr = [sys.executable, "-m", "torch.distributed.run"]
    g = str(nodes.half)
    row: dict = {"script": script, "gpus_per_node": nodes.half}
    d = nodes.both(f"{script}-decide", sl, ["--explain=json", "--nproc-per-node", g,
                                            *script_args(script, 100_000)])
    row["decide_rc"], row["decide_s"] = d["rc"], round(d["wall_s"], 1)
    try:
        text = d["output"][0]
        plan = json.JSONDecoder().raw_decode(text[text.index("{"):])[0]
        row["chosen_nnodes"] = plan.get("nnodes")
        row["reasons"] = [r["text"] for r in plan.get("reasons", [])
                          if "node" in (r.get("rule") or "") or "node" in (r.get("text") or "")][:6]
        row["strategy"] = plan.get("strategy")
    except (ValueError, KeyError) as e:
        row["decide_error"] = f"{type(e).__name__}: {e}; tail: {d['output'][0][-800:]}"
    both = nodes.both(f"{script}-torchrun2", tr, ["--nproc-per-node", g, *script_args(script)])
    single = nodes.both(f"{script}-torchrun1", tr, ["--nproc-per-node", g, *script_args(script)],
                        nnodes=1)
    row["measured"] = {"2": rate(both), "1": rate(single)}
    row["torchrun_rc"] = {"2": both["rc"], "1": single["rc"]}
    launch = nodes.both(f"{script}-launch", sl, ["--nproc-per-node", g, *script_args(script)])
    row["launch_rc"], row["launch_rate"] = launch["rc"], rate(launch)
    row["launch_lines"] = [ln for o in launch["output"] for ln in o.splitlines()
                           if ln.startswith("smartlaunch:")][:8]
    m = row["measured"]
    if row.get("chosen_nnodes") and all(m.values()):
        best = max(m.values())
        row["regret"] = best / m[str(row["chosen_nnodes"])] - 1
    out["rows"].append(row)
    print(json.dumps(row, indent=1), flush=True)
    return row


def measurement(row: dict) -> dict:
    """One script's row as a measurement of the common format (bench/_record.py)."""
    m = row.get("measured") or {}
    rcs = [*(row.get("decide_rc") or []), *(row.get("launch_rc") or []),
           *[c for v in (row.get("torchrun_rc") or {}).values() for c in v]]
    out = {"conditions": {"script": row["script"], "gpus_per_node": row.get("gpus_per_node")},
           "figures": {"chosen_nnodes": int(row["chosen_nnodes"]) if row.get("chosen_nnodes")
                       else None, "strategy": row.get("strategy"),
                       "sps_2_nodes": m.get("2"), "sps_1_node": m.get("1"),
                       "launch_sps": row.get("launch_rate"), "regret": row.get("regret"),
                       "decide_s": row.get("decide_s"),
                       # the deciding node's reason that holds both predictions
                       "why": next((r for r in row.get("reasons") or () if "predicted" in r),
                                   None)},
           "detail": {"launch_lines": row.get("launch_lines") or []}}
    err = row.get("error") or row.get("decide_error") or \
        (f"exit codes {rcs}" if any(rcs) else None)
    if err:
        out["error"] = err
    return out


def records(path: Path) -> list[dict]:
    """The measurements of a multinode-gpu.json."""
    return [measurement(r) for r in json.loads(Path(path).read_text())["rows"]]


def bench(argv: list[str]) -> list[dict]:
    """bench/run.py's entry: main(argv) into --out (a temporary directory unless given), then
    one measurement per script."""
    argv = list(argv)
    if "--out" not in argv:
        argv += ["--out", tempfile.mkdtemp(prefix="multinode-gpu-")]
    main(argv)
    path = Path(argv[argv.index("--out") + 1]) / "multinode-gpu.json"
    return records(path) if path.exists() else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scripts", default="gpt-124m-b8")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = gpu_count()
    if n < 2:
        print("bench/multinode_gpu.py: needs at least 2 GPUs (one per node)")
        return 2
    root = Path(tempfile.mkdtemp(prefix="mngpu-", dir=out_dir))
    out: dict = {"gpus": n, "rows": []}
    for script in args.scripts.split(","):
        try:
            one(Nodes(root, n), script, out)
        except Exception as e:          # one script failing keeps the others' rows
            out["rows"].append({"script": script, "error": f"{type(e).__name__}: {e}"})
        (out_dir / "multinode-gpu.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
