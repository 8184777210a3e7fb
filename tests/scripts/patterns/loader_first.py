"""The data first: the DataLoader, its worker processes and its iterator exist before the
model (and before the process group), and the first batch is fetched before the model is built.
"""
import common

import torch


def main():
    ap = common.parser(__doc__)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    distributed = common.world() > 1
    dataset = common.data()
    if distributed:
        common.init()       # the sampler needs the group; the loader still comes first
    dl = common.loader(dataset, args.batch_size, num_workers=args.workers,
                       persistent_workers=args.workers > 0)
    it = iter(dl)
    first = next(it)
    net = common.wrap(common.model())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    step, batch = 0, first
    while step < args.steps:
        loss = common.train_step(net, opt, *batch)
        step += 1
        try:
            batch = next(it)
        except StopIteration:
            it = iter(dl)
            batch = next(it)
    print(f"finished: loss {loss.item():.3f}", flush=True)
    common.done()


if __name__ == "__main__":
    main()
