"""Its own background thread, not a daemon: a prefetcher that fills a queue with batches while
the main thread trains; told to stop and joined after the last step."""
import queue
import threading

import common

import torch


def produce(dataset, batch_size, q, stop):
    g = torch.Generator().manual_seed(2)
    x, y = dataset.tensors
    while not stop.is_set():
        idx = torch.randint(0, len(x), (batch_size,), generator=g)
        try:
            q.put((x[idx], y[idx]), timeout=0.1)
        except queue.Full:
            continue


def main():
    ap = common.parser(__doc__)
    args = ap.parse_args()
    common.init()
    q, stop = queue.Queue(maxsize=16), threading.Event()
    thread = threading.Thread(target=produce, args=(common.data(), args.batch_size, q, stop),
                              name="prefetch")
    thread.start()
    net = common.wrap(common.model())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for _ in range(args.steps):
        loss = common.train_step(net, opt, *q.get(timeout=60))
    stop.set()
    thread.join()
    print(f"finished: loss {loss.item():.3f}", flush=True)
    common.done()


if __name__ == "__main__":
    main()
