"""The harness's shared pieces (runtime/optim.py, runtime/run.py): every offline trainer steps and saves alike."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

import rlhfkit.runtime.optim as optim
from rlhfkit.runtime.final_folder import actor_saver
from rlhfkit.runtime.optim import optimizer_step


class Acc:  # one process on the CPU
    num_processes = 1
    device = torch.device("cpu")

    @staticmethod
    def clip_grad_norm_(params, max_norm):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)


def test_optimizer_step_clips_steps_trims_the_heap_and_reports(monkeypatch):
    trims = []
    monkeypatch.setattr(optim, "trim_heap", lambda: trims.append(1) or True)
    w = torch.nn.Parameter(torch.tensor([1.0, 0.0], device="cpu"))
    opt = torch.optim.SGD([w], lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    (w * torch.tensor([3.0, 4.0], device="cpu")).sum().backward()  # gradient (3, 4): norm 5, clipped to 1
    out = optimizer_step([w], opt, sched, Acc(), 1.0, loss=2.0)
    assert out == {"params/grad_norm": 5.0, "params/lr": 0.5, "params/skipped_steps": 0.0}
    assert torch.allclose(w.detach(), torch.tensor([1.0 - 0.5 * 0.6, -0.5 * 0.8], device="cpu"))
    assert trims == [1]  # once a step, for every offline trainer alike


def test_optimizer_step_skips_a_non_finite_loss_and_still_trims(monkeypatch):
    trims = []
    monkeypatch.setattr(optim, "trim_heap", lambda: trims.append(1) or True)
    w = torch.nn.Parameter(torch.ones(2, device="cpu"))
    opt = torch.optim.SGD([w], lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    w.sum().backward()
    out = optimizer_step([w], opt, sched, Acc(), 1.0, loss=float("nan"))
    assert out["params/skipped_steps"] == 1.0 and torch.equal(w.detach(), torch.ones(2, device="cpu"))
    assert trims == [1]


def test_actor_saver_warns_when_sharded_weights_skip_the_merged_copy(monkeypatch):
    import rlhfkit.models.policy as policy

    saved, printed = [], []
    monkeypatch.setattr(policy, "save_actor", lambda model, tok, folder, state_dict=None, merge=False:
                        saved.append((Path(folder).name, merge)))
    run = SimpleNamespace(cfg=SimpleNamespace(save_merged=True, lora=True), print=printed.append)
    save = actor_saver(run, "model", "tok")
    save(Path("final"), None)  # live weights: the adapter and the merged copy
    assert saved == [("final", False), ("merged", True)] and printed == []
    saved.clear()
    save(Path("final"), {"w": 0})  # gathered (sharded) weights: no merged copy, said so
    assert saved == [("final", False)]
    assert len(printed) == 1 and "save_merged skipped" in printed[0]
