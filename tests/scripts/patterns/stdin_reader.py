"""Reads its configuration from stdin before training (`echo lr=0.05 | torchrun ...`): every
line `key=value`; an empty stdin (EOF at once) keeps the defaults."""
import sys

import common

import torch


def main():
    ap = common.parser(__doc__)
    args = ap.parse_args()
    conf = dict(line.strip().split("=", 1) for line in sys.stdin if "=" in line)
    common.init()
    net = common.wrap(common.model())
    opt = torch.optim.SGD(net.parameters(), lr=float(conf.get("lr", 0.01)))
    for _, (x, y) in common.batches(common.loader(common.data(), args.batch_size), args.steps):
        loss = common.train_step(net, opt, x, y)
    print(f"finished ({len(conf)} settings from stdin): loss {loss.item():.3f}", flush=True)
    common.done()


if __name__ == "__main__":
    main()
