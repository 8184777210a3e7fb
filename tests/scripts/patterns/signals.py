"""Its own SIGTERM and SIGINT handlers (preemption: finish the step, save, leave): a signal
sets a flag the loop reads after each step; it then writes a checkpoint and returns."""
import os
import signal
import tempfile

import common

import torch

stop = {"signal": None}


def on_signal(signum, frame):
    stop["signal"] = signum


def main():
    ap = common.parser(__doc__)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    common.init()
    net = common.wrap(common.model())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for _, (x, y) in common.batches(common.loader(common.data(), args.batch_size), args.steps):
        loss = common.train_step(net, opt, x, y)
        if stop["signal"] is not None:
            break
    with tempfile.TemporaryDirectory(prefix="pattern-ckpt-") as d:
        torch.save(net.state_dict(), os.path.join(d, "last.pt"))
    how = f"stopped by signal {stop['signal']}" if stop["signal"] else "finished"
    print(f"{how}: loss {loss.item():.3f}", flush=True)
    common.done()


if __name__ == "__main__":
    main()
