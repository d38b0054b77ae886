"""`rlhfkit report` and `rlhfkit doctor` on a tiny but real PPO run folder."""

from __future__ import annotations

import json

from rlhfkit.cli import main as cli_main
from rlhfkit.core.config import build_config
from rlhfkit.trainers.ppo import train
from rlhfkit.trainers.ppo_config import PPOConfig


def test_report_and_doctor_on_a_tiny_real_run(tmp_path, tiny_model_dir, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(f"Say <b>something</b> about item {i}" for i in range(16)))
    cfg = build_config(PPOConfig, {"model": str(tiny_model_dir), "prompts": str(prompts), "reward": "length:3",
                                   "iterations": 3, "rollout_batch_size": 4, "mini_batch_size": 4,
                                   "micro_batch_size": 2, "max_new_tokens": 6, "num_eval_prompts": 0,
                                   "dtype": "fp32", "output_dir": str(tmp_path / "runs"), "run_name": "tiny",
                                   "quiet": True, "tensorboard": False})
    train(cfg)
    run = tmp_path / "runs" / "tiny"
    out = tmp_path / "report"
    assert cli_main(["report", str(run), "--out", str(out), "--no-png"]) == 0
    html = (out / "report.html").read_text()
    for key in ("rollout/reward_mean", "loss/policy", "params/approx_kl", "params/grad_norm"):
        assert key in html, key
    assert "<b>something</b>" not in html and "&lt;b&gt;something&lt;/b&gt;" in html  # prompts escaped
    assert "http://" not in html.replace("http://www.w3.org", "")  # opens offline: nothing fetched
    capsys.readouterr()  # the run's own output (it ends with a "[done] ..." line): only doctor's JSON below
    rc = cli_main(["doctor", str(run), "--json"])
    assert rc in (0, 1)  # 1 only when a critical finding exists
    printed = capsys.readouterr().out
    start = printed.find("{") if printed.find("{") >= 0 and (printed.find("[") < 0 or printed.find("{") < printed.find("[")) else printed.find("[")
    parsed = json.loads(printed[start:])
    assert isinstance(parsed, (list, dict))
