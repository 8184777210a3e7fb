"""sys.exit in the middle of the loop: after --exit-after steps (early stopping), with --code."""
import sys

import common

import torch


def main():
    ap = common.parser(__doc__)
    ap.add_argument("--exit-after", type=int, default=None, help="default: half of --steps")
    ap.add_argument("--code", type=int, default=0)
    args = ap.parse_args()
    after = args.steps // 2 if args.exit_after is None else args.exit_after
    common.init()
    net = common.wrap(common.model())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for step, (x, y) in common.batches(common.loader(common.data(), args.batch_size), args.steps):
        loss = common.train_step(net, opt, x, y)
        if step + 1 == after:
            print(f"stopping early after {after} steps: loss {loss.item():.3f}", flush=True)
            sys.exit(args.code)
    print("finished without stopping early", flush=True)
    common.done()


if __name__ == "__main__":
    main()
