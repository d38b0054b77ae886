"""The report's first screen: the before/after block with its metric named, the key charts first,
readable before/after samples, whole-number iteration ticks, and the keys that differ from the defaults."""

from __future__ import annotations

import re

from rlhfkit.diagnostics.headline import before_after, differing_keys, key_first
from rlhfkit.diagnostics.plot import Series, layout_chart


def test_iteration_ticks_are_whole_numbers():
    layout = layout_chart("m", [Series("a", [(0, 1.0), (1, 2.0), (2, 3.0)], "#000")])
    assert [label for _, label in layout.xticks] == ["0", "1", "2"]  # not 0.5, 1.5


def test_before_after_names_the_metric():
    summary = {"eval_before": {"mean": 0.25, "std": 0.5, "n": 4, "samples": []},
               "eval_after": {"mean": 0.75, "std": 0.5, "n": 4, "samples": []}}
    assert before_after(summary, {"reward": "sentiment"}) == [
        ("mean held-out reward (reward=sentiment)", 0.25, 0.75), ("std of held-out reward (reward=sentiment)", 0.5, 0.5),
        ("samples", 4.0, 4.0)]
    assert before_after({"eval_before": 0.1, "eval_after": 0.3}, {"judge": "sentiment"}) == [
        ("mean judged score of held-out samples (judge=sentiment)", 0.1, 0.3)]
    # data without a held-out split was evaluated on training prompts (summary.json's eval_on): said so
    assert before_after({**summary, "eval_on": "training"}, {"reward": "sentiment"})[0] == (
        "mean training-prompt reward (reward=sentiment)", 0.25, 0.75)


def test_key_charts_first_and_cost_last():
    names = ["params/grad_norm", "timing/rollout_s", "loss/policy", "rollout/reward_mean", "throughput/tokens_per_s",
             "rollout/length_mean"]
    assert key_first(names) == [("key metrics", ["rollout/reward_mean", "loss/policy"]),
                                ("params/", ["params/grad_norm"]), ("rollout/", ["rollout/length_mean"]),
                                ("timing/", ["timing/rollout_s"]), ("throughput/", ["throughput/tokens_per_s"])]


def test_differing_keys():
    assert differing_keys([{"lr": 1, "seed": 0}, {"lr": 2, "seed": 0}], None) == ["lr"]
    assert differing_keys([{"lr": 1, "seed": 0, "run_name": "x"}], {"lr": 1, "seed": 3, "run_name": None}) == ["seed"]


def test_the_report_of_a_run_opens_with_its_before_after_block(tmp_path, tiny_model_dir):
    from rlhfkit.core.config import build_config
    from rlhfkit.diagnostics.report import build_report
    from rlhfkit.diagnostics.rundir import load_run
    from rlhfkit.trainers.grpo import train
    from rlhfkit.trainers.grpo_config import GRPOConfig

    (tmp_path / "p.txt").write_text("\n".join(f"Say {i}." for i in range(8)))
    train(build_config(GRPOConfig, dict(
        model=str(tiny_model_dir), prompts=str(tmp_path / "p.txt"), reward="length:3", iterations=3,
        rollout_batch_size=4, group_size=2, mini_batch_size=4, micro_batch_size=4, max_new_tokens=4,
        num_eval_prompts=2, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="grpo-t", quiet=True,
        tensorboard=False)))
    from rlhfkit.commands.runs import config_defaults

    html = build_report([load_run(tmp_path / "runs" / "grpo-t")], tmp_path / "report", png=False,
                        config_defaults=config_defaults).read_text()
    assert html.index("id='headline'") < html.index("id='runs'") < html.index("id='metrics'")
    headline = html[html.index("id='headline'"):html.index("id='runs'")]
    # p.txt has no held-out split: the evaluation ran on training prompts, and the headline says so
    assert "<td>mean training-prompt reward (reward=length:3)</td>" in headline and "<th>change</th>" in headline
    metrics = html[html.index("id='metrics'"):html.index("id='samples'")]
    assert re.search(r"<h3>([^<]*)</h3>", metrics).group(1) == "key metrics"
    assert metrics.index("rollout/reward_mean") < metrics.index("timing/")
    assert "held-out samples before and after training" in html and "{&#x27;prompt&#x27;" not in html
    assert "Keys that differ from the defaults of <code>rlhfkit grpo</code>" in html
    assert re.search(r"<tr><td><code>iterations</code></td><td>3</td><td class='muted'>30</td></tr>", html)


def test_per_reward_metrics_are_described():
    from rlhfkit.diagnostics.glossary import describe

    assert describe("reward/python:r.py:exact").startswith("Batch mean of one of several rewards")
