"""A CPU-side catch for tensors made on the wrong device.

On a GPU, `torch.arange(n)` in library code makes a CPU tensor that then meets CUDA tensors and
crashes ("Expected all tensors to be on the same device"); on a CPU the same line runs fine, so no
CPU test could see it. `HostFactoryGuard` is a `TorchFunctionMode` that records every tensor
factory (`arange`, `zeros`, `tensor`, `randperm`, ...) called from rlhfkit's own source without a
`device=` argument. Library code then has to say where each new tensor lives: the device of the
tensors it will meet (`device=x.device`), or `device="cpu"` where host memory is the point (token
lists collated before the move, rows of a rollout kept in CPU memory, a CPU generator's draws).

Factories called by torch, transformers or peft are not recorded (they are theirs to place), and
neither are `*_like` / `Tensor.new_*` (they follow their input) nor `as_tensor` of a tensor.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

import rlhfkit

PACKAGE_DIR = str(Path(rlhfkit.__file__).resolve().parent)
FACTORIES = frozenset({
    torch.arange, torch.full, torch.zeros, torch.ones, torch.empty, torch.tensor, torch.as_tensor,
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace, torch.logspace, torch.eye,
    torch.empty_strided, torch.scalar_tensor,
})


class HostFactoryGuard(TorchFunctionMode):
    """Within `with HostFactoryGuard() as guard:`, `guard.sites` collects "file:line func" of every
    rlhfkit call to a tensor factory that names no device (file relative to the package)."""

    def __init__(self):
        super().__init__()
        self.sites: set[str] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and "device" not in kwargs and not (
                func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)):
            caller = sys._getframe(1)
            path = str(Path(caller.f_code.co_filename).resolve())
            if path.startswith(PACKAGE_DIR):
                self.sites.add(f"{path[len(PACKAGE_DIR) + 1:]}:{caller.f_lineno} torch.{func.__name__}")
        return func(*args, **kwargs)
