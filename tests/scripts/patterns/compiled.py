"""torch.compile of the model (inductor, the default backend; a C compiler builds its CPU code)."""
import common

import torch


def main():
    ap = common.parser(__doc__)
    args = ap.parse_args()
    common.init()
    net = common.wrap(common.model())
    net = torch.compile(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    dl = common.loader(common.data(), args.batch_size)
    for _, (x, y) in common.batches(dl, args.steps):
        loss = common.train_step(net, opt, x, y)
    print(f"finished: loss {loss.item():.3f}", flush=True)
    common.done()


if __name__ == "__main__":
    main()
