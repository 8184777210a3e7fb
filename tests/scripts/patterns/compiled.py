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
    common.train(net, opt, dl, args.steps)


if __name__ == "__main__":
    main()
