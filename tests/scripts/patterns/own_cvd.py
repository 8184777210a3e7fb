"""Sets its own CUDA_VISIBLE_DEVICES before importing torch (a script that pins "its" GPU from
LOCAL_RANK, as some do), then trains on the GPU it sees, or the CPU."""
import os

os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("LOCAL_RANK", "0")

import common  # noqa: E402

import torch  # noqa: E402


def main():
    ap = common.parser(__doc__)
    args = ap.parse_args()
    common.init()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = common.wrap(common.model().to(device))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for _, (x, y) in common.batches(common.loader(common.data(), args.batch_size), args.steps):
        loss = common.train_step(net, opt, x.to(device), y.to(device))
    print(f"finished on {device} (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']}): "
          f"loss {loss.item():.3f}", flush=True)
    common.done()


if __name__ == "__main__":
    main()
