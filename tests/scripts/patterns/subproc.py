"""Subprocesses: one run to completion before training (a `git describe`-like query), and a
helper started in its own session that lives beside training (a metrics sidecar, as some
trackers start), told to stop at the end.

    subproc.py [--attached]     (--attached: the helper stays in the script's session)
"""
import subprocess
import sys

import common

import torch

HELPER = "import sys\nfor line in sys.stdin:\n    pass\n"     # lives until its stdin closes


def main():
    ap = common.parser(__doc__)
    ap.add_argument("--attached", action="store_true")
    args = ap.parse_args()
    version = subprocess.run([sys.executable, "-c", "import sys; print(sys.version_info[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    helper = subprocess.Popen([sys.executable, "-c", HELPER], stdin=subprocess.PIPE, text=True,
                              start_new_session=not args.attached)
    common.init()
    net = common.wrap(common.model())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for step, (x, y) in common.batches(common.loader(common.data(), args.batch_size), args.steps):
        loss = common.train_step(net, opt, x, y)
        if step % 50 == 0:
            helper.stdin.write(f"{step} {loss.item()}\n")
    helper.stdin.close()
    helper.wait(timeout=60)
    print(f"finished (python {version}): loss {loss.item():.3f}", flush=True)
    common.done()


if __name__ == "__main__":
    main()
