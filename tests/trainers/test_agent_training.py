"""`rlhfkit grpo agent=python:FILE:FN` on a tiny random Llama: the user's OpenAI-client agent runs the
episodes through the server on the policy, the first micro-batch's ratio is exactly 1, failed
episodes are counted and the run goes on, and an iteration where every episode fails stops with
one line and exit 2."""

from __future__ import annotations

import json
import textwrap

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError, UserError
from rlhfkit.trainers.grpo import train as grpo_train
from rlhfkit.trainers.grpo_config import GRPOConfig, RLOOConfig
from rlhfkit.trainers.ppo import train as ppo_train
from rlhfkit.trainers.ppo_config import PPOConfig

pytest.importorskip("openai")

AGENT = textwrap.dedent('''
    import itertools
    import random

    COUNTER = itertools.count(1)  # next() is atomic: episodes run in threads

    def two_turns(client, record):
        """Asks, then follows up; reward: the reply length's parity (spread within groups)."""
        messages = [{"role": "user", "content": record["prompt"]}]
        first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, temperature=0.2)
        messages += [first.choices[0].message, {"role": "user", "content": "And then?"}]
        second = client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=100)
        return float(len(second.choices[0].message.content or "") % 2)

    def editing(client, record):
        """Re-orders the conversation between calls: rows cut per call."""
        first = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "a"}])
        client.chat.completions.create(model="gpt-4o-mini", messages=[
            first.choices[0].message, {"role": "user", "content": "b"}, {"role": "user", "content": "a"}])
        return [0.0, float(random.random() < 0.5)]

    def flaky(client, record):
        """Fails in a few ways on some rows, works on the others."""
        k = next(COUNTER)
        if k % 4 == 1:
            raise RuntimeError("tool server down")
        reward = two_turns(client, record)
        return None if k % 4 == 2 else reward

    def broken(client, record):
        raise KeyError("missing column")
''')


def cfg_for(tmp_path, tiny_model_dir, fn="two_turns", cls=GRPOConfig, **kw):
    agent = tmp_path / "my_agent.py"
    agent.write_text(AGENT)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Tell me about thing {i}." for i in range(16)))
    base = dict(model=str(tiny_model_dir), prompts=str(prompts), agent=f"python:{agent}:{fn}",
                agent_model="gpt-4o-mini", agent_concurrency=8, iterations=1, rollout_batch_size=8, group_size=4,
                micro_batch_size=4, mini_batch_size=4, max_new_tokens=5, num_eval_prompts=0, dtype="fp32",
                update_epochs=1, output_dir=str(tmp_path / "runs"), run_name="t", quiet=True, tensorboard=False,
                drop_zero_std_groups=False)
    base.update(kw)
    return build_config(cls, base)


def metrics_rows(tmp_path):
    return [json.loads(x) for x in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("fn", "cls"), [("two_turns", GRPOConfig), ("editing", RLOOConfig)])
def test_agent_episodes_train_with_step_zero_ratio_exactly_one(tmp_path, tiny_model_dir, fn, cls):
    grpo_train(cfg_for(tmp_path, tiny_model_dir, fn, cls, ratio_check_tol=1e-5))
    (row,) = metrics_rows(tmp_path)
    # the update's first micro-batch repeats the scoring pass on the recorded ids: ratio 1 up to float noise
    assert row["params/ratio_first_microbatch_maxdev"] < 1e-5
    assert row["agent/error_rate"] == 0.0 and row["agent/calls_per_episode"] == 2.0
    assert row["agent/rows_per_episode"] == (1.0 if fn == "two_turns" else 2.0)


@pytest.mark.parametrize("fn", ["two_turns", "editing"])
def test_ppo_trains_on_agent_episodes_with_step_zero_ratio_one(tmp_path, tiny_model_dir, fn):
    cfg = build_config(PPOConfig, {k: v for k, v in vars(cfg_for(tmp_path, tiny_model_dir, fn)).items()
                                   if k in PPOConfig.__dataclass_fields__ and k not in (
                                       "update_epochs", "drop_zero_std_groups")} | {"ppo_epochs": 1})
    ppo_train(cfg)
    (row,) = metrics_rows(tmp_path)
    assert row["params/ratio_first_microbatch_maxdev"] < 1e-5
    assert row["agent/error_rate"] == 0.0
    assert row["agent/rows_per_episode"] == (1.0 if fn == "two_turns" else 2.0)


def test_failed_episodes_are_counted_and_the_run_goes_on(tmp_path, tiny_model_dir):
    grpo_train(cfg_for(tmp_path, tiny_model_dir, "flaky", iterations=2))
    rows = metrics_rows(tmp_path)
    assert len(rows) == 2
    for row in rows:
        assert row["agent/raised_rate"] == 0.25 and row["agent/bad_reward_rate"] == 0.25
        assert row["agent/error_rate"] == 0.5


def test_every_episode_failing_stops_with_one_line_and_exit_2(tmp_path, tiny_model_dir, capsys):
    cfg = cfg_for(tmp_path, tiny_model_dir, "broken")
    with pytest.raises(UserError, match=r"iteration 0: agent: every episode failed; the first: episode 0: raised: "
                                        r"KeyError: 'missing column'"):
        grpo_train(cfg)
    argv = [f"{k}={v}" for k, v in {"model": tiny_model_dir, "agent": cfg.agent, "prompts": cfg.prompts,
                                    "iterations": 1, "rollout_batch_size": 4, "group_size": 2, "micro_batch_size": 2,
                                    "mini_batch_size": 2, "max_new_tokens": 3, "num_eval_prompts": 0,
                                    "output_dir": tmp_path / "runs2", "run_name": "t", "quiet": True}.items()]
    capsys.readouterr()
    assert cli_main(["grpo", *argv]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlhfkit: error")]
    assert len(err) == 1 and "every episode failed; the first: episode 0: raised: KeyError" in err[0]


def test_agent_options_fail_fast(tmp_path, tiny_model_dir):
    with pytest.raises(UserError, match="no such file"):
        grpo_train(cfg_for(tmp_path, tiny_model_dir, agent="python:missing.py:fn"))
    assert not (tmp_path / "runs" / "t").exists()  # nothing written
    with pytest.raises(ConfigError, match="agent and env"):
        cfg_for(tmp_path, tiny_model_dir, env="arithmetic-tool")
    with pytest.raises(ConfigError, match="advantage must be group or rloo"):
        cfg_for(tmp_path, tiny_model_dir, advantage="remax")
    with pytest.raises(ConfigError, match="agent_timeout"):
        cfg_for(tmp_path, tiny_model_dir, agent_timeout=0)


def test_the_documented_openai_agent_trains_unchanged(tmp_path):
    """docs/environments.md's calculator agent, copied from the page as it is, runs a GRPO iteration."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "environments.md").read_text(encoding="utf-8")
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if b.startswith('"""calc_agent.py')]
    (tmp_path / "calc_agent.py").write_text(code)
    from tiny_lm import build_tiny_model, build_tokenizer

    tok = build_tokenizer()  # a byte tokenizer: the tool description alone is ~400 tokens
    model = build_tiny_model(len(tok))
    model.config.max_position_embeddings = 2048
    model.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    cfg = build_config(GRPOConfig, dict(
        model=str(tmp_path / "lm"), agent=f"python:{tmp_path / 'calc_agent.py'}:solve", agent_model="gpt-4o-mini",
        iterations=1, rollout_batch_size=8, group_size=4, micro_batch_size=4, mini_batch_size=4, max_new_tokens=6,
        num_eval_prompts=2, dtype="fp32", update_epochs=1, output_dir=str(tmp_path / "runs"), run_name="t",
        quiet=True, tensorboard=False, drop_zero_std_groups=False))
    summary = grpo_train(cfg)
    (row,) = metrics_rows(tmp_path)
    assert row["agent/error_rate"] == 0.0 and row["agent/calls_per_episode"] >= 1.0
    assert row["params/ratio_first_microbatch_maxdev"] < 1e-5
    assert summary["eval_after"]["n"] == 2  # the agent also runs the held-out evaluation


def episode_rollout(episode: list[int], scores: list[float]):
    """Rows of agent episodes (info["episode"]), one reward per row on its last token."""
    import torch

    from rlhfkit.rollout import Rollout

    B, R = len(episode), 3
    return Rollout(query_ids=torch.ones(B, 2, dtype=torch.long), query_mask=torch.ones(B, 2, dtype=torch.long),
                   response_ids=torch.ones(B, R, dtype=torch.long), response_mask=torch.ones(B, R),
                   stopped=torch.ones(B, dtype=torch.bool), scores=torch.tensor(scores),
                   info={"episode": episode}, prompts=["p"] * B, completions=["c"] * B)


@pytest.mark.parametrize("advantage", ["group", "rloo"])
def test_agent_advantages_are_taken_over_each_groups_episodes(advantage):
    """G = 2; episode 0 gave two rows, 1 one, 2 one (its partner 3 failed), 4 and 5 one each with
    equal rewards: the baseline is over episodes, not rows; a group of one and a flat group get 0,
    and drop_zero_std_groups keeps the rows of group 0 only."""
    from rlhfkit.trainers.grpo import compute_advantages, informative_rows
    from rlhfkit.trainers.grpo_variants import ADVANTAGES

    cfg = build_config(GRPOConfig, {"advantage": advantage, "rollout_batch_size": 6, "group_size": 2,
                                    "mini_batch_size": 6, "micro_batch_size": 6})
    ro = episode_rollout([0, 0, 1, 2, 4, 5], [1.0, 1.0, 0.0, 5.0, 2.0, 2.0])
    ro, metrics = compute_advantages(ro, cfg)
    # group: (1 - 0.5) / (std([1, 0]) = sqrt(0.5) + 1e-6); rloo: 1 - 0 and 0 - 1
    a = 0.5 / (0.5 ** 0.5 + 1e-6) if advantage == "group" else 1.0
    assert ro.advantages[:, 0].tolist() == pytest.approx([a, a, -a, 0.0, 0.0, 0.0], rel=1e-6)
    assert metrics["rollout/zero_std_group_fraction"] == pytest.approx(2 / 3)  # groups 1 (one episode) and 2
    assert informative_rows(ro, cfg, ADVANTAGES[advantage]).tolist() == [0, 1, 2]


@pytest.mark.parametrize("advantage", ["group", "rloo"])
def test_a_batch_left_with_part_of_one_group_trains(advantage):
    """G = 4 and only episodes 0 and 1 gave rows (the others timed out): their group is partial, so its
    baseline is over those two episodes; two completions in group 0 once passed for full groups in
    order, and the estimator refused a batch of 2 with group_size 4."""
    from rlhfkit.trainers.grpo import compute_advantages

    cfg = build_config(GRPOConfig, {"advantage": advantage, "rollout_batch_size": 8, "group_size": 4,
                                    "mini_batch_size": 8, "micro_batch_size": 8})
    ro, _ = compute_advantages(episode_rollout([0, 1], [1.0, 0.0]), cfg)
    a = 0.5 / (0.5 ** 0.5 + 1e-6) if advantage == "group" else 1.0  # as in the test above
    assert ro.advantages[:, 0].tolist() == pytest.approx([a, -a], rel=1e-6)
