"""make_optimizer: fused AdamW in a single process, the default multi-tensor AdamW under a launcher;
both give the same update."""

from __future__ import annotations

import torch

from rlhfkit.trainers.common import make_optimizer


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
