"""A DataLoader in every configuration a training script may pick: worker count, start method
(fork, spawn, forkserver), persistent workers, pinned memory.

    loader.py --workers N --context fork|spawn|forkserver [--persistent] [--pin-memory] --steps N
"""
import common

import torch


def main():
    ap = common.parser(__doc__)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--context", choices=["fork", "spawn", "forkserver"], default=None)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--pin-memory", action="store_true")
    args = ap.parse_args()
    common.init()
    kw = {"num_workers": args.workers, "pin_memory": args.pin_memory}
    if args.workers:
        kw.update(persistent_workers=args.persistent, multiprocessing_context=args.context)
    dl = common.loader(common.data(), args.batch_size, **kw)
    net = common.wrap(common.model())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    common.train(net, opt, dl, args.steps)


if __name__ == "__main__":
    main()
