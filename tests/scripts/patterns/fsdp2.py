"""FSDP2: `fully_shard` on each layer and the root, over a process group initialised at every
world size (one too: env:// under a launcher, else a file:// rendezvous of one)."""
import common

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main():
    ap = common.parser(__doc__)
    args = ap.parse_args()
    common.init(always=True)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    net = common.model()
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    dl = common.loader(common.data(), args.batch_size)
    common.train(net, opt, dl, args.steps)


if __name__ == "__main__":
    main()
