"""A progress bar: tqdm where it is installed, else a line rewritten with '\r' on stderr."""
import sys

import common

import torch

try:
    from tqdm import tqdm
except ImportError:
    tqdm = None


class CarriageReturn:
    def __init__(self, total):
        self.total, self.n = total, 0

    def update(self, k=1):
        self.n += k
        sys.stderr.write(f"\rtraining: {self.n}/{self.total} steps")
        sys.stderr.flush()

    def close(self):
        sys.stderr.write("\n")


def main():
    ap = common.parser(__doc__)
    args = ap.parse_args()
    common.init()
    net = common.wrap(common.model())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    bar = tqdm(total=args.steps) if tqdm is not None else CarriageReturn(args.steps)
    for _, (x, y) in common.batches(common.loader(common.data(), args.batch_size), args.steps):
        loss = common.train_step(net, opt, x, y)
        bar.update(1)
    bar.close()
    print(f"finished: loss {loss.item():.3f}", flush=True)
    common.done()


if __name__ == "__main__":
    main()
