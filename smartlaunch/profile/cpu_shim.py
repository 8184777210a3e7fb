"""Opt-in CPU emulation (`--cpu-shim`, SMARTLAUNCH_DRYRUN_CPU_SHIM=1) for dry runs of
CUDA-only scripts without a GPU: counts and batch size are exact, times are the CPU's. Maps
`.to(cuda)`/`.cuda()` to the CPU, `pin_memory`, `set_device`, `synchronize` to no-ops, NCCL to
gloo and DDP `device_ids` to None."""
from __future__ import annotations


def _is_cuda(dev) -> bool:
    import torch
    if isinstance(dev, int) and not isinstance(dev, bool):
        return True
    if isinstance(dev, str):
        return dev.startswith("cuda")
    return isinstance(dev, torch.device) and dev.type == "cuda"


def _strip_device(args, kwargs):
    args = tuple("cpu" if i == 0 and _is_cuda(a) else a for i, a in enumerate(args))
    if _is_cuda(kwargs.get("device")):
        kwargs = {**kwargs, "device": "cpu"}
    return args, kwargs


def install() -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if torch.cuda.is_available():
        return  # a real GPU: nothing to emulate

    tensor_to, module_to = torch.Tensor.to, torch.nn.Module.to

    def t_to(self, *args, **kwargs):
        args, kwargs = _strip_device(args, kwargs)
        kwargs.pop("non_blocking", None)
        return tensor_to(self, *args, **kwargs)

    def m_to(self, *args, **kwargs):
        args, kwargs = _strip_device(args, kwargs)
        return module_to(self, *args, **kwargs)

    torch.Tensor.to = t_to
    torch.nn.Module.to = m_to
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    torch.cuda.set_device = lambda *a, **k: None
    torch.cuda.synchronize = lambda *a, **k: None

    init_pg = dist.init_process_group

    def init_process_group(*args, **kwargs):
        if args and isinstance(args[0], str) and "nccl" in args[0]:
            args = ("gloo",) + args[1:]
        if "nccl" in str(kwargs.get("backend", "")):
            kwargs["backend"] = "gloo"
        return init_pg(*args, **kwargs)

    dist.init_process_group = init_process_group
    torch.distributed.distributed_c10d.init_process_group = init_process_group

    ddp_init = DistributedDataParallel.__init__

    def ddp(self, module, *args, **kwargs):
        kwargs.pop("device_ids", None)
        kwargs.pop("output_device", None)
        if args:        # positional device_ids, output_device: dropped too
            return ddp_init(self, module, None, None, *args[2:], **kwargs)
        return ddp_init(self, module, **kwargs)

    DistributedDataParallel.__init__ = ddp
