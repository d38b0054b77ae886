"""make_optimizer: fused AdamW in a single process, the default multi-tensor AdamW under a launcher;
both give the same update."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.runtime.optim import make_optimizer


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(7, generator=g))]


def _steps(opt, params, n=3):
    for k in range(n):
        for i, p in enumerate(params):
            p.grad = torch.full_like(p, 0.1 * (k + 1) * (i + 1))
        opt.step()
    return [p.detach().clone() for p in params]


def test_single_process_is_fused_and_a_launched_process_is_not(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    opt, _ = make_optimizer(_params(), lr=1e-2, warmup_steps=1)
    assert opt.defaults["fused"] is True
    monkeypatch.setenv("WORLD_SIZE", "2")
    opt, _ = make_optimizer(_params(), lr=1e-2, warmup_steps=1)
    assert not opt.defaults["fused"]


def test_fused_and_default_adamw_give_the_same_weights(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    a = _params()
    fused = _steps(make_optimizer(a, lr=1e-2, warmup_steps=1, weight_decay=0.1)[0], a)
    monkeypatch.setenv("WORLD_SIZE", "2")
    b = _params()
    plain = _steps(make_optimizer(b, lr=1e-2, warmup_steps=1, weight_decay=0.1)[0], b)
    assert not torch.equal(fused[0], _params()[0])  # the weights moved
    for x, y in zip(fused, plain):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


def test_frozen_parameters_are_left_out():
    p = _params()
    p[1].requires_grad_(False)
    opt, _ = make_optimizer(p, lr=1e-2, warmup_steps=1)
    assert [len(g["params"]) for g in opt.param_groups] == [1]


def test_warm_up_scales_the_lr_linearly_then_holds_it():
    """lr at optimiser step k (0-based) = lr * min(1, (k + 1) / warmup_steps): 1/4, 2/4, 3/4, 1, 1."""
    from rlhfkit.runtime.optim import make_optimizer

    opt, sched = make_optimizer(_params(), lr=0.8, warmup_steps=4)
    seen = []
    for _ in range(5):
        seen.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.8 * 1 / 4, 0.8 * 2 / 4, 0.8 * 3 / 4, 0.8, 0.8], rel=1e-12)


def test_logged_grad_norm_is_taken_before_clipping():
    """guarded_step returns the norm the gradients had (3-4-5 triangle: 5), then clips them to 1."""
    from accelerate import Accelerator

    from rlhfkit.runtime.faults import guarded_step
    from rlhfkit.runtime.optim import make_optimizer

    p = torch.nn.Parameter(torch.zeros(2))
    opt, sched = make_optimizer([p], lr=0.0, warmup_steps=1)
    p.grad = torch.tensor([3.0, 4.0])
    seen = {}
    real_step = opt.step

    def step(*a, **k):  # the gradient the optimiser sees: clipped to norm 1
        seen["grad"] = p.grad.clone()
        return real_step(*a, **k)

    opt.step = step
    norm, skipped = guarded_step([p], opt, sched, Accelerator(cpu=True), max_grad_norm=1.0, loss=1.0)
    assert (norm, skipped) == (pytest.approx(5.0, rel=1e-6), False)
    assert seen["grad"] == pytest.approx(torch.tensor([0.6, 0.8]), rel=1e-5)


def test_a_rollout_larger_than_the_machine_is_refused_up_front():
    """16 bytes per prompt token and 40 per response token and row (rollout/core.py's tensors)."""
    from rlhfkit.errors import ConfigError
    from rlhfkit.estimate.memory import check_rollout_fits, rollout_bytes

    assert rollout_bytes(1000, 100, 50) == 1000 * (16 * 100 + 40 * 50)  # 3.6 MB
    check_rollout_fits(1000, 100, 50, memory=3_600_000)  # exactly fits
    with pytest.raises(ConfigError, match=r"rollout_batch_size \(1001\) needs ~0.0 GiB .* more than this "
                                          r"machine's 0.0 GiB: lower rollout_batch_size"):
        check_rollout_fits(1001, 100, 50, memory=3_600_000)
