"""The optimiser every trainer uses: AdamW (or `optim`'s SGD / Adafactor) with a linear learning-rate
warm-up, then a constant, linearly decaying or cosine learning rate (`lr_scheduler_type`,
transformers' schedules)."""

from __future__ import annotations

import math
import os
from typing import Protocol

import torch

from rlhfkit.core.allocator import trim_heap
from rlhfkit.core.bounds import check_warmup
from rlhfkit.core.choices import LR_SCHEDULES
from rlhfkit.runtime.faults import guarded_step


def single_process() -> bool:
    """No torch.distributed group and no launcher-set WORLD_SIZE above 1."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size() == 1
    return int(os.environ.get("WORLD_SIZE", "1")) <= 1


SCHEDULES = LR_SCHEDULES


class OptimizerOptions(Protocol):
    """What `optimizer_for` reads of a config: trainers/options.OptimizerArgs."""

    lr: float
    warmup_steps: int
    warmup_ratio: float
    weight_decay: float
    adam_eps: float
    lr_scheduler_type: str
    optim: str


def optimizer_for(params, cfg: OptimizerOptions, total_steps: int | None):
    """make_optimizer with a trainer config's OptimizerArgs (lr, warmup_steps, weight_decay, adam_eps,
    lr_scheduler_type) over a run of `total_steps` optimiser steps; warmup_ratio > 0 makes the warm-up
    ceil(total_steps x warmup_ratio) steps (transformers' rounding)."""
    warmup = warmup_steps_of(cfg, total_steps)
    warning = check_warmup(warmup, total_steps, cfg.lr) if total_steps else None
    optimizer, scheduler = make_optimizer(params, cfg.lr, warmup, cfg.weight_decay, cfg.adam_eps,
                                          schedule=cfg.lr_scheduler_type, total_steps=total_steps, optim=cfg.optim)
    scheduler.warning = warning  # printed by the run once its folder is taken (runtime/run.py), not before
    return optimizer, scheduler


def new_optimizer(groups: list[dict], optim: str, lr: float, weight_decay: float, eps: float):
    """The torch optimiser transformers' `optim` name means (trainers/options.OptimizerArgs.optim)."""
    if optim == "sgd":
        return torch.optim.SGD(groups, lr=lr, weight_decay=weight_decay)
    if optim == "adafactor":
        from transformers import Adafactor

        return Adafactor(groups, lr=lr, weight_decay=weight_decay, scale_parameter=False, relative_step=False)
    if optim not in ("adamw_torch", "adamw_torch_fused"):
        raise ValueError(f"optim must be one of adamw_torch, adamw_torch_fused, sgd, adafactor, got {optim!r}")
    tensors = [p for g in groups for p in g["params"]]
    fusable = all(p.dtype in (torch.float32, torch.bfloat16, torch.float16) for p in tensors)
    fused = fusable and (single_process() or optim == "adamw_torch_fused")
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, eps=eps, fused=fused or None)


def warmup_steps_of(cfg: OptimizerOptions, total_steps: int | None) -> int:
    """The warm-up in optimiser steps: ceil(total_steps x warmup_ratio) when warmup_ratio > 0, else
    warmup_steps."""
    return math.ceil((total_steps or 0) * cfg.warmup_ratio) if cfg.warmup_ratio > 0 else cfg.warmup_steps


def make_optimizer(params, lr: float, warmup_steps: int, weight_decay: float = 0.0, eps: float = 1e-8,
                   schedule: str = "constant", total_steps: int | None = None, optim: str = "adamw_torch"):
    """(AdamW, LambdaLR): linear warm-up over `warmup_steps` optimiser steps, then a constant lr.
    The warm-up tames the approx-KL spike of Adam's first, large updates (docs/pitfalls.md#adam-warmup).
    The constant schedule's first step already runs at lr / warmup_steps. `schedule` linear or
    cosine: transformers' get_linear/cosine_schedule_with_warmup over `total_steps` (their warm-up
    starts at 0: step s < warmup_steps runs at lr * s / warmup_steps), decaying to 0 at the end.

    `params`: parameters (those without grad are dropped) or parameter groups (dicts with their own
    "lr"). Single-process runs use torch's fused AdamW (one kernel per parameter group: on CPU its
    step over 135M parameters takes 0.12 s against 0.7 s for the default multi-tensor one; the same
    update rule). Multi-process runs keep the default, which every engine (FSDP, DeepSpeed) accepts,
    unless `optim` is adamw_torch_fused; sgd and adafactor replace AdamW (`new_optimizer`)."""
    params = list(params)
    if params and isinstance(params[0], dict):
        groups = [{**g, "params": [p for p in g["params"] if p.requires_grad]} for g in params]
    else:
        groups = [{"params": [p for p in params if p.requires_grad]}]
    opt = new_optimizer(groups, optim, lr, weight_decay, eps)
    if schedule == "constant":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / max(1, warmup_steps)))
        return opt, sched
    from transformers import get_scheduler

    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    return opt, get_scheduler(schedule, opt, num_warmup_steps=warmup_steps, num_training_steps=max(1, total_steps or 1))


def optimizer_step(params, optimizer, scheduler, accelerator, max_grad_norm: float, loss: float, guard=None,
                   where: str = "") -> dict[str, float]:
    """Clip, step and schedule the accumulated gradients (skipped when the loss or the gradient norm is
    non-finite, runtime/faults.guarded_step), then trim the heap; returns params/grad_norm, params/lr and
    params/skipped_steps. The optimiser step of every trainer but the on-policy update loop (which
    reads its stats first: trainers/rl_update.py)."""
    grad_norm, skipped = guarded_step(params, optimizer, scheduler, accelerator, max_grad_norm, loss=loss, guard=guard,
                                      where=where)
    trim_heap()  # e.g. KTO at 3.93 -> 3.41 GB peak RSS (core/allocator.py)
    return {"params/grad_norm": grad_norm, "params/lr": scheduler.get_last_lr()[0], "params/skipped_steps": float(skipped)}
