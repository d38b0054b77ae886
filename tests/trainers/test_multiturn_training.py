"""PPO and the GRPO family trained on multi-turn rollouts (env=...), on a tiny random Llama with
scripted environments: the commands run, the ratio check holds, the env metrics are logged, and
GRPO learns to call a tool when only episodes that call it are rewarded."""

from __future__ import annotations

import json

import pytest

import rlhfkit.envs
from rlhfkit.commands import command_main
from rlhfkit.core.config import build_config
from rlhfkit.envs import Step
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.grpo import train as grpo_train
from rlhfkit.trainers.grpo_config import GRPOConfig, RLOOConfig
from rlhfkit.trainers.ppo import train as ppo_train
from rlhfkit.trainers.ppo_config import PPOConfig
from rlhfkit.trainers.rl import env_prompts

PROMPTS = [f"Write a review of thing number {i}." for i in range(32)]


class ToolEnv:
    """Reward 1 only for episodes that call the tool. A first turn whose text starts with a lowercase
    letter is a tool call (about a quarter of the random tiny model's first tokens): the tool answers
    and the model gets a second turn, whose end pays 1. Any other first turn ends the episode with 0."""

    def __init__(self):
        self.called = False

    def reset(self, record):
        return [{"role": "user", "content": record["prompt"]}]

    def step(self, history, model_turn):
        if self.called:
            return Step(None, 1.0, True)
        if model_turn[:1].isascii() and model_turn[:1].islower():
            self.called = True
            return Step([{"role": "tool", "content": "42"}], 0.0, False, {"tool_call": "calc"})
        return Step(None, 0.0, True)


@pytest.fixture()
def tool_env(monkeypatch):
    specs = []

    def factory(spec, tokenizer=None, timeout_s=None):
        assert tokenizer is not None  # the policy's: the env's tool-call format follows it
        assert timeout_s == 60.0  # env_timeout's default, passed on (the wait for an openenv: server)
        specs.append(spec)
        return ToolEnv

    monkeypatch.setattr(rlhfkit.envs, "make_env_factory", factory, raising=False)
    return specs


def cfg_for(cls, tmp_path, tiny_model_dir, **kw):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS))
    base = dict(model=str(tiny_model_dir), prompts=str(prompts), env="scripted-tool", iterations=1,
                rollout_batch_size=8, micro_batch_size=4, mini_batch_size=4, max_new_tokens=4, max_turns=2,
                max_total_tokens=64, num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"),
                run_name="t", quiet=True, tensorboard=False)
    if cls is not PPOConfig:
        base["group_size"] = 4
    base.update(kw)
    return build_config(cls, base)


def metrics_rows(tmp_path):
    return [json.loads(x) for x in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- the commands


@pytest.mark.parametrize(("cls", "backend"), [(PPOConfig, "hf"), (GRPOConfig, "hf"), (RLOOConfig, "hf"),
                                              (GRPOConfig, "lean")])
def test_trainers_run_on_multi_turn_rollouts_with_the_ratio_check(tmp_path, tiny_model_dir, tool_env, cls, backend,
                                                                  capsys, monkeypatch):
    """One iteration with two update epochs (PPO, GRPO): the first micro-batch's ratio is 1 (else
    RatioCheckError), the env metrics are logged, held-out evaluation reports the tool-call rate.
    generation_backend=lean: the lean loop samples every turn of the rollout."""
    from rlhfkit.rollout import backends

    lean_turns = []
    real = backends.LeanBackend.generate_ids
    monkeypatch.setattr(backends.LeanBackend, "generate_ids",
                        staticmethod(lambda *a, **kw: lean_turns.append(len(a[2])) or real(*a, **kw)))
    train = ppo_train if cls is PPOConfig else grpo_train
    extra = {"eval_samples_per_prompt": 1} if cls is PPOConfig else {"drop_zero_std_groups": False}
    train(cfg_for(cls, tmp_path, tiny_model_dir, num_eval_prompts=4, quiet=False, generation_backend=backend, **extra))
    assert (len(lean_turns) >= 1) == (backend == "lean")  # one call per turn, its rows still running
    assert tool_env == ["scripted-tool"]
    (row,) = metrics_rows(tmp_path)
    assert row["params/ratio_first_microbatch_maxdev"] < 1e-4
    assert 1.0 <= row["rollout/turns_mean"] <= 2.0
    # an episode has a second turn exactly when it called the tool: turns = 1 + tool call
    assert row["rollout/turns_mean"] == pytest.approx(1.0 + row["rollout/tool_call_rate"])
    assert row["rollout/tool_error_rate"] == 0.0
    # score = 1 exactly for episodes that called the tool
    assert row["rollout/score_mean"] == pytest.approx(row["rollout/tool_call_rate"])
    if row["rollout/tool_call_rate"] > 0:
        assert row["rollout/env_tokens_mean"] > 0
    out = capsys.readouterr().out
    assert "[eval] before training: mean reward" in out and "tool-call rate" in out
    assert "env=scripted-tool" in out


def test_help_shows_the_env_options(capsys):
    for name in ("grpo", "ppo"):
        assert command_main(name)(["--help"]) == 0
        out = capsys.readouterr().out
        for name in ("env", "max_turns", "max_total_tokens"):
            assert f"  {name} (" in out, name


def test_env_option_errors():
    with pytest.raises(ConfigError, match=r"max_turns \(0\) must be >= 1"):
        build_config(GRPOConfig, {"max_turns": 0})
    with pytest.raises(ConfigError, match=r"max_total_tokens \(0\) must be >= 1"):
        build_config(PPOConfig, {"max_total_tokens": 0})
    with pytest.raises(ConfigError, match="env .* set generation_backend=hf or lean"):
        build_config(GRPOConfig, {"env": "arithmetic-tool", "generation_backend": "vllm"})
    for backend in ("lean", "hf"):  # both samplers run an env's turns
        assert build_config(GRPOConfig, {"env": "arithmetic-tool", "generation_backend": backend}).env


def test_an_env_brings_its_problems_when_prompts_is_left_at_its_default():
    tool = rlhfkit.envs.make_env_factory("arithmetic-tool")
    assert env_prompts(PPOConfig(env="arithmetic-tool"), tool) == "builtin:arithmetic"  # PPO's default is reviews
    assert env_prompts(PPOConfig(env="arithmetic-tool", prompts="my.jsonl"), tool) == "my.jsonl"
    assert env_prompts(PPOConfig(), tool) == "builtin:reviews"
    assert env_prompts(GRPOConfig(env="custom")) == "builtin:arithmetic"  # a factory without prompts: the default
    factory = type("F", (), {"prompts": "builtin:stories"})()
    assert env_prompts(GRPOConfig(env="custom"), factory) == "builtin:stories"


# ----------------------------------------------------------------------------- learning


def _tool_learning(tmp_path, tiny_model_dir, iterations):
    grpo_train(cfg_for(GRPOConfig, tmp_path, tiny_model_dir, iterations=iterations, lora=False, lr=3e-2,
                       warmup_steps=1, rollout_batch_size=16, group_size=4, mini_batch_size=8, micro_batch_size=8,
                       max_new_tokens=2))
    rows = metrics_rows(tmp_path)
    first = sum(r["rollout/tool_call_rate"] for r in rows[:2]) / 2
    last = sum(r["rollout/tool_call_rate"] for r in rows[-2:]) / 2
    return first, last, rows


def test_grpo_learns_to_call_the_tool(tmp_path, tiny_model_dir, tool_env):
    """Eight iterations of full fine-tuning: the tool-call rate (= the mean reward) rises from about
    a quarter to most episodes (seen: 0.41 over the first two iterations -> 0.91 over the last two)."""
    first, last, rows = _tool_learning(tmp_path, tiny_model_dir, 8)
    assert last > first + 0.3 and last >= 0.75, (first, last)
    assert all(r["rollout/score_mean"] == pytest.approx(r["rollout/tool_call_rate"]) for r in rows)
