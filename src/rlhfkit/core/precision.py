"""Compute precision of forward passes."""

from __future__ import annotations

import contextlib

import torch


def autocast(dtype: str, device: torch.device):
    """bf16 autocast for forward passes; a no-op for fp32."""
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
