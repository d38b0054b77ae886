"""Where tensors live.

Every tensor rlhfkit makes names its device (tests/trainers/test_device_factories.py checks it on
the CPU, where a tensor on the wrong device would otherwise pass unseen): the device of the tensors
it meets (`device=x.device`), or HOST where host memory is the point. Host memory holds what is
kept between passes and moved to the accelerator one micro-batch at a time: encoded data sets and
collated batches, a rollout's rows and per-token results, index permutations drawn from a CPU
generator.
"""

from __future__ import annotations

import torch

HOST = torch.device("cpu")


def free_cuda_bytes(device: torch.device) -> int:
    """Bytes a new CUDA tensor on `device` can take: what the driver reports free plus what torch's
    caching allocator holds unused (reserved - allocated)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
