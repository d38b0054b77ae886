"""value_head_lr: the value head in a parameter group of its own, and old one-group checkpoints read into it."""

from __future__ import annotations

import json

import torch
from torch import nn

from rlhfkit.core.config import build_config
from rlhfkit.models.policy import ActorCritic, ValueHead
from rlhfkit.runtime.checkpointer import regroup
from rlhfkit.runtime.optim import make_optimizer
from rlhfkit.trainers.ppo_config import PPOConfig
from tests.trainers.test_resume import make_cfg, read_jsonl


class _LM(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.a = nn.Linear(n, n)
        self.b = nn.Linear(n, 2)


def _actor(critic: bool, value_head_lr: float | None = None) -> ActorCritic:
    actor = ActorCritic.__new__(ActorCritic)
    nn.Module.__init__(actor)
    actor.policy, actor.value_head = _LM(3), ValueHead(3)
    actor.critic = _LM(4) if critic else None
    actor.value_head_lr = value_head_lr
    return actor


def parameter_groups(actor: ActorCritic, value_head_lr: float | None) -> list[dict]:
    actor.value_head_lr = value_head_lr
    return actor.parameter_groups()


def test_groups_keep_the_parameters_order_and_give_the_head_its_lr():
    for critic in (False, True):
        actor = _actor(critic)
        groups = parameter_groups(actor, 1e-4)
        assert [p for g in groups for p in g["params"]] == list(actor.parameters())
        head = {id(p) for p in actor.value_head.parameters()}
        assert [g.get("lr") for g in groups] == [None, 1e-4] + ([None] if critic else [])
        assert all((id(p) in head) == (g.get("lr") == 1e-4) for g in groups for p in g["params"])
        assert parameter_groups(actor, None) == [{"params": list(actor.parameters())}]


def test_the_head_steps_at_its_own_lr():
    """Adam's first step moves every weight with a non-zero gradient by lr x g / (|g| + eps) = lr
    (to eps): 1e-3 for the policy's weights, 1e-5 for the head's (in float64, so the weights' own
    rounding stays far below either step)."""
    torch.manual_seed(0)
    actor = _actor(False).double()
    nn.init.normal_(actor.value_head.summary.weight)
    opt, _ = make_optimizer(parameter_groups(actor, 1e-5), lr=1e-3, warmup_steps=1, eps=1e-12)
    before = [p.detach().clone() for p in actor.parameters()]
    x = torch.randn(5, 3, dtype=torch.float64)
    (actor.policy.b(actor.policy.a(x)).square().sum() + actor.value_head(actor.policy.a(x)[None]).sum()).backward()
    opt.step()
    moved = [(p - b).abs() for p, b in zip(actor.parameters(), before)]
    policy_moves = torch.cat([m.flatten() for m in moved[:4]])
    head_moves = torch.cat([m.flatten() for m in moved[4:]])
    torch.testing.assert_close(policy_moves, torch.full_like(policy_moves, 1e-3), rtol=1e-4, atol=0)
    torch.testing.assert_close(head_moves, torch.full_like(head_moves, 1e-5), rtol=1e-4, atol=0)


def test_regroup_splits_a_one_group_state_in_order_and_leaves_others_alone():
    actor = _actor(True)
    one, _ = make_optimizer(parameter_groups(actor, None), lr=1e-3, warmup_steps=1)
    for p in actor.parameters():
        p.grad = torch.randn_like(p)
    one.step()
    saved = one.state_dict()
    three, _ = make_optimizer(parameter_groups(actor, 1e-4), lr=1e-3, warmup_steps=1)
    three.load_state_dict(regroup(saved, three))
    for p in actor.parameters():  # each parameter got its own moments back
        assert torch.equal(three.state[p]["exp_avg"], one.state[p]["exp_avg"])
        assert torch.equal(three.state[p]["exp_avg_sq"], one.state[p]["exp_avg_sq"])
    assert regroup(saved, one) is saved
    assert regroup(three.state_dict(), one) is not None  # several groups saved: left to torch


def test_ppo_default_and_validation():
    assert PPOConfig().value_head_lr == 1e-4
    import pytest

    from rlhfkit.errors import UserError

    with pytest.raises(UserError, match=r"value_head_lr \(0.0\) must be > 0"):
        build_config(PPOConfig, {"value_head_lr": 0.0})
    assert build_config(PPOConfig, {"value_head_lr": None}).value_head_lr is None


def test_a_one_group_checkpoint_resumes_with_the_head_in_its_own_group(tmp_path, tiny_model_dir):
    """A run saved before value_head_lr existed (one group) continues with it set: the optimiser state
    loads, the lr of each group is the configured one, and the run ends."""
    from rlhfkit.trainers.ppo import train

    runs = tmp_path / "runs"
    train(make_cfg("ppo", tmp_path, tiny_model_dir, "old", iterations=2, save_every=5, value_head_lr=None))
    train(make_cfg("ppo", tmp_path, tiny_model_dir, "old", iterations=3, value_head_lr=1e-4,
                   resume=str(runs / "old")))
    rows = read_jsonl(runs / "old" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    assert json.loads((runs / "old" / "summary.json").read_text())["run_dir"]
