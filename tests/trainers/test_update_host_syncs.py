"""The update's micro-batch loop (runtime/accumulate.py `accumulate`, as trainers/rl_update.py calls it) never waits for the
device: no call from rlhfkit code inside it reads a tensor on the host (`.item()`, `.tolist()`,
bool/int/float of a tensor, `.cpu()`, `.to("cpu")`). On a GPU each such call stalls Python until
the queued kernels finish, so the next micro-batch's kernels cannot be queued behind them. The
loop's stats are 0-d tensors, read once per optimiser step (`read_on_host`).

A TorchFunctionMode sees every such call while the loop runs; a call counts when the nearest frame
outside torch is in src/rlhfkit (transformers' own checks are not ours to change)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import rlhfkit
import rlhfkit.trainers.rl_update as rl_update
from rlhfkit.core.config import build_config

SRC = str(Path(rlhfkit.__file__).parent)
TORCH = str(Path(torch.__file__).parent)
READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
         torch.Tensor.cpu}


def to_host(func, args, kwargs) -> bool:
    """A .to() that copies a tensor off an accelerator to the CPU (a device or a string among its
    arguments). On this CPU-only test no tensor is off the CPU, so only `.cpu()` and the reads
    count here; the check is for the GPU run of the same test."""
    if func is not torch.Tensor.to or args[0].device.type == "cpu":
        return False
    targets = [*args[1:], kwargs.get("device")]
    return any(str(t).startswith("cpu") for t in targets if isinstance(t, (str, torch.device)))


def caller() -> str | None:
    """file:line of the nearest frame outside torch and this file, when it is rlhfkit's."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(TORCH) or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(SRC):
        return None
    return f"{Path(frame.f_code.co_filename).relative_to(SRC)}:{frame.f_lineno} {frame.f_code.co_name}"


class HostReads(TorchFunctionMode):
    """Records rlhfkit's host reads of tensors while active."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READS or to_host(func, args, kwargs):
            where = caller()
            if where is not None:
                self.calls.append(f"{getattr(func, '__name__', func)} at {where}")
        return func(*args, **kwargs)


@pytest.fixture()
def loop_reads(monkeypatch):
    """Host reads made from rlhfkit code inside every micro-batch loop of the update; and the
    number of loops run."""
    mode, loops = HostReads(), []
    real = rl_update.accumulate

    def watched(*args, **kwargs):
        loops.append(1)
        with mode:
            return real(*args, **kwargs)

    monkeypatch.setattr(rl_update, "accumulate", watched)
    return mode.calls, loops


def run(tmp_path, tiny_model_dir, command: str, **settings):
    from rlhfkit.trainers import grpo, ppo
    from rlhfkit.trainers.grpo_config import GRPOConfig
    from rlhfkit.trainers.ppo_config import PPOConfig

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Write a review of thing number {i}." for i in range(32)))
    base = dict(model=str(tiny_model_dir), prompts=str(prompts), reward="length", iterations=1, rollout_batch_size=8,
                mini_batch_size=4, micro_batch_size=2, max_new_tokens=6, num_eval_prompts=0,
                output_dir=str(tmp_path / "runs"), run_name="t", quiet=True, tensorboard=False, **settings)
    if command == "ppo":
        ppo.train(build_config(PPOConfig, base))
    else:
        grpo.train(build_config(GRPOConfig, {"group_size": 4, **base}))


# Left: the shared-prompt plan (models/shared_prompts.py: which rows share a prompt, how long the
# prefix all rows share) decides tensor shapes, so it reads the device ids: two reads per micro-batch
# with shared prompts or a shared prefix.
SHARING_PLAN = ("models/shared_prompts.py:",)


@pytest.mark.parametrize("command, settings", [
    ("ppo", {"dtype": "fp32", "share_prefix": False}),  # LoRA on the top layer: the kept trunk, the value head
    ("grpo", {"dtype": "fp32", "share_prompts": False, "importance_level": "sequence", "tis_cap": 2.0}),  # GSPO, TIS
])
def test_no_host_read_inside_the_micro_batch_loop(tmp_path, tiny_model_dir, loop_reads, command, settings):
    calls, loops = loop_reads
    run(tmp_path, tiny_model_dir, command, **settings)
    assert len(loops) >= 2  # optimiser steps (2 mini-batches x epochs), each with its micro-batch loop watched
    assert sorted(set(calls)) == []


@pytest.mark.parametrize("command, settings", [("ppo", {"dtype": "bf16", "share_prefix": True}),
                                               ("grpo", {"dtype": "bf16", "share_prompts": True, "beta": 0.05})])
def test_with_shared_prompts_only_the_sharing_plan_reads(tmp_path, tiny_model_dir, loop_reads, command, settings):
    calls, _ = loop_reads
    run(tmp_path, tiny_model_dir, command, **settings)
    assert calls and all(c.split(" at ")[1].startswith(SHARING_PLAN) for c in calls), sorted(set(calls))


def test_the_mode_sees_a_host_read_from_rlhfkit_only():
    """The check has power: a branch on a tensor in rlhfkit code is recorded, with its place; reads
    in this file, and rlhfkit calls that read nothing, are not."""
    from rlhfkit.algos import masked_mean

    mode = HostReads()
    with mode:
        torch.tensor([1.0, 2.0], device="cpu").sum().item()  # this file: not counted
        masked_mean(torch.ones(2, device="cpu"), torch.ones(2, device="cpu"))  # rlhfkit, no host read
    assert mode.calls == []
    with mode:
        rl_update.check_first_ratio(torch.zeros((), device="cpu"), 1e-3)  # `if max_dev > tol` on a tensor
    assert len(mode.calls) == 1 and mode.calls[0].startswith("__bool__ at trainers/rl_update.py:"), mode.calls
