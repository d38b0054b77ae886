"""The new reward kinds in real runs on the tiny model: several together with weights, each logged on its own,
the remote waiting time in the metrics, verl's parquet layout as the prompts; and the bad inputs a user can
write on the command line, each one line, exit 2 and nothing written."""

from __future__ import annotations

import json
import socket
import textwrap

import pytest

from rlhfkit.cli import main
from rlhfkit.core.config import build_config
from rlhfkit.trainers.grpo import train
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.ppo_config import PPOConfig

from reward_servers import scripted_server

VERL = textwrap.dedent('''
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0 if str(ground_truth) in solution_str else 0.0
''')


def _verl_prompts(path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": f"Say the number {i}."}],
             "ability": "echo", "reward_model": {"style": "rule", "ground_truth": str(i)},
             "extra_info": {"split": "train", "index": i}} for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_weighted_remote_and_verl_rewards_in_a_grpo_run(tmp_path, tiny_model_dir):
    """reward=verl:FILE,http://... reward_weights=1,0.5 on a verl parquet: both rewards logged apart, the score
    is their weighted sum, the server saw verl's columns, the waiting time is a metric."""
    _verl_prompts(tmp_path / "train.parquet")
    (tmp_path / "verl_reward.py").write_text(VERL)
    with scripted_server("echo", tmp_path) as server:
        verl_spec = f"verl:{tmp_path}/verl_reward.py"
        cfg = build_config(GRPOConfig, dict(
            model=str(tiny_model_dir), prompts=str(tmp_path / "train.parquet"), reward=f"{verl_spec},{server.url()}",
            reward_weights=[1.0, 0.5], reward_batch_size=3, iterations=1, rollout_batch_size=8, group_size=4,
            mini_batch_size=4, micro_batch_size=2, max_new_tokens=6, num_eval_prompts=0, dtype="fp32",
            output_dir=str(tmp_path / "runs"), run_name="t", quiet=True, tensorboard=False, log_samples=8))
        train(cfg)
        bodies = [r["body"] for r in server.requests()]
    (row,) = [json.loads(x) for x in (tmp_path / "runs/t/metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (tmp_path / "runs/t/samples.jsonl").read_text().splitlines()]
    assert f"reward/{verl_spec}" in row and f"reward/{server.url()}" in row
    assert row["timing/reward_remote_s"] > 0
    # 8 completions, reward_batch_size=3; the requests run concurrently, so they reach the server in any order
    assert sorted(len(b["query"]) for b in bodies) == [2, 3, 3]
    assert bodies[0]["reward_model"][0]["style"] == "rule" and bodies[0]["data_source"] == ["toy"] * len(bodies[0]["query"])
    assert all(lab == rm["ground_truth"] for b in bodies for lab, rm in zip(b["labels"], b["reward_model"]))
    for s in samples:  # score = 1 x verl + 0.5 x the echo server's len(completion)
        assert s["score"] == pytest.approx(float(str(s["prompt"].split()[-1][:-1]) in s["completion"])
                                           + 0.5 * len(s["completion"]))
    assert row[f"reward/{server.url()}"] == pytest.approx(sum(len(s["completion"]) for s in samples) / 8)


# ----------------------------------------------------------------------------- bad input on the command line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def work(tmp_path, monkeypatch):
    path = tmp_path / "work"
    path.mkdir()
    monkeypatch.chdir(path)
    (tmp_path / "prompts.txt").write_text("\n".join(f"Write about thing {i}." for i in range(8)))
    return path


# warmup_steps=1: the default warm-up outlasts these runs' optimiser steps, and its warning would precede an error
QUICK = ["iterations=1", "rollout_batch_size=4", "group_size=2", "mini_batch_size=4", "micro_batch_size=2",
         "max_new_tokens=4", "num_eval_prompts=0", "dtype=fp32", "quiet=true", "tensorboard=false", "warmup_steps=1"]


@pytest.mark.parametrize("command", ["grpo", "ppo"])
@pytest.mark.parametrize("case", ["unreachable", "judge-unreachable", "bad-url", "verl-no-truth", "key-unset",
                                  "bad-batch"])
def test_bad_reward_input_is_one_line_exit_2_and_writes_nothing(case, command, work, tiny_model_dir, capsys,
                                                                monkeypatch):
    port = _free_port()
    (work.parent / "v.py").write_text(VERL)
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    overrides, fragment = {
        "unreachable": ([f"reward=sentiment,http://127.0.0.1:{port}/get_reward", "reward_weights=1,0.2"],
                        f"cannot reach the reward server at 127.0.0.1:{port}"),
        "judge-unreachable": ([f"reward=length:3,judge:http://127.0.0.1:{port}/v1", "reward_weights=1,0.2"],
                              f"cannot reach the reward server at 127.0.0.1:{port}"),
        "bad-url": (["reward=http://127.0.0.1:x/get_reward"], "has a port that is not a number"),
        "verl-no-truth": ([f"reward=verl:{work.parent}/v.py"], "verl's compute_score needs a ground truth"),
        "key-unset": ([f"reward=http://127.0.0.1:{port}/r", "reward_api_key_env=NO_SUCH_KEY_VAR"],
                      "the environment variable NO_SUCH_KEY_VAR is unset"),
        "bad-batch": (["reward=sentiment", "reward_batch_size=0"], "reward_batch_size (0) must be >= 1"),
    }[case]
    argv = [command, f"model={tiny_model_dir}", f"prompts={work.parent / 'prompts.txt'}", *QUICK, *overrides]
    if command == "ppo":
        argv = [a for a in argv if not a.startswith("group_size")]
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("rlhfkit:")]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    assert fragment in lines[0], lines[0]
    assert not list(work.rglob("*")), "a bad reward left files behind"


def test_help_describes_every_reward_kind(capsys):
    for cls in (GRPOConfig, PPOConfig):
        from rlhfkit.core.command_line import help_text

        text = " ".join(help_text(cls, "rlhfkit x").split())
        for kind in ("sentiment", "arithmetic", "length[:N]", "model:PATH", "python:module:function",
                     "http(s)://HOST:PORT/PATH", "judge:URL", "verl:FILE.py[:FN]", "openrlhf:FILE.py[:FN]",
                     "reward_weights", "reward_batch_size", "reward_timeout", "reward_retries", "judge_model",
                     "judge_template", "judge_api_key_env", "reward_api_key_env", "docs/rewards.md"):
            assert kind in text, kind


@pytest.mark.parametrize("mode", ["nan", "html"])
def test_a_server_that_answers_badly_mid_run_is_one_line_and_leaves_nothing(mode, work, tiny_model_dir, capsys):
    """The server passes the check before the model loads, then answers the first rollout wrongly."""
    with scripted_server(mode, work.parent) as server:
        rc = main(["grpo", f"model={tiny_model_dir}", f"prompts={work.parent / 'prompts.txt'}", *QUICK,
                   f"reward={server.url()}", "reward_retries=0"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("rlhfkit:")]
    assert rc == 2 and "Traceback" not in err and len(lines) == 1, err
    assert f"rlhfkit: error: reward server {server.url()}" in lines[0]
    assert not list(work.rglob("*")), "a failed run left files behind"
