"""A multiprocessing Pool: it preprocesses the data before training and stays open through it,
summing each step's loss history asynchronously (closed and joined after the last step)."""
import multiprocessing as mp

import common

import torch


def normalise(chunk):
    x = torch.tensor(chunk)
    return ((x - x.mean()) / (x.std() + 1e-6)).tolist()


def total(values):
    return sum(values)


def main():
    ap = common.parser(__doc__)
    ap.add_argument("--procs", type=int, default=2)
    args = ap.parse_args()
    common.init()
    dataset = common.data()
    with mp.Pool(args.procs) as pool:
        rows = pool.map(normalise, dataset.tensors[0][:256].tolist(), chunksize=32)
        dataset.tensors[0][:256] = torch.tensor(rows)
        net = common.wrap(common.model())
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        history, pending = [], None
        for step, (x, y) in common.batches(common.loader(dataset, args.batch_size), args.steps):
            history.append(common.train_step(net, opt, x, y).item())
            if step % 50 == 0:
                pending = pool.apply_async(total, (history[-50:],))
        if pending is not None:
            pending.get(timeout=60)
        pool.close()
        pool.join()
    print(f"finished: loss {history[-1]:.3f}", flush=True)
    common.done()


if __name__ == "__main__":
    main()
