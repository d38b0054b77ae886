"""`rlhfkit doctor` on histories it used to misjudge or could not read: no params/max_grad_norm
(judged against config.yaml, else 1.0) and logs written by TRL (trainer_state.json, JSONL)."""

from __future__ import annotations

import json

from diag_synthetic import healthy_ppo, healthy_sft, write_run

from rlhfkit.commands.doctor import doctor_main
from rlhfkit.diagnostics import diagnose
from rlhfkit.diagnostics.foreign import rename, with_iterations
from rlhfkit.diagnostics.rundir import load_run


def _grad_findings(rows, **kw):
    return [f for f in diagnose(rows, strict=True, **kw) if f.rule == "grad_norm_explosion"]


def test_without_a_logged_clip_threshold_the_default_of_one_applies():
    rows = [{**r, "params/grad_norm": 17.0} for r in healthy_sft(12)]  # steady 17: no spike vs its own history
    assert all("params/max_grad_norm" not in r for r in rows)
    found = _grad_findings(rows)
    assert found and found[0].severity == "warning" and found[0].iteration == 0
    assert "17x the clip threshold max_grad_norm=1 (assumed default)" in found[0].message
    assert found[0].evidence["max_grad_norm_source"] == "assumed default"


def test_the_runs_config_sets_the_threshold_and_a_logged_one_wins(tmp_path, capsys):
    rows = [{**r, "params/grad_norm": 17.0} for r in healthy_sft(12)]
    loose = write_run(tmp_path, "loose", rows, config={"command": "sft", "max_grad_norm": 5.0})
    assert load_run(loose).defaults == {"params/max_grad_norm": 5.0}
    assert doctor_main([str(loose), "--json"]) == 0
    assert "grad_norm_explosion" not in capsys.readouterr().out  # 17 / 5 = 3.4x: clipping doing its job
    strict = write_run(tmp_path, "strict", rows, config={"command": "sft", "max_grad_norm": 1.0})
    doctor_main([str(strict), "--json"])
    (f,) = [f for f in json.loads(capsys.readouterr().out) if f["rule"] == "grad_norm_explosion"]
    assert f["evidence"]["max_grad_norm_source"] == "config.yaml" and "(config.yaml)" in f["message"]
    logged = [{**r, "params/max_grad_norm": 5.0} for r in rows]
    assert _grad_findings(logged, defaults={"params/max_grad_norm": 1.0}) == []


def _trl_ppo_state(n: int = 7) -> dict:
    """TRL PPOTrainer's trainer_state.json for a learner's first rollouts: clip fraction 0.6 -> 0.8,
    a flat value loss while the policy moves, plus the Trainer's final summary row."""
    clip = [0.6, 0.63, 0.67, 0.7, 0.73, 0.77, 0.8]
    log = [{"episode": 64 * (i + 1), "eps": 3, "objective/kl": 0.5 + 0.3 * i, "objective/entropy": 40.0,
            "objective/non_score_reward": -0.01 * i, "objective/rlhf_reward": 0.25 + 0.01 * i,
            "objective/scores": 0.25 + 0.02 * i, "policy/approxkl_avg": 0.02, "policy/clipfrac_avg": clip[i],
            "loss/policy_avg": -0.01, "loss/value_avg": 0.05, "val/clipfrac_avg": 0.1, "policy/entropy_avg": 2.0,
            "val/ratio": 1.0, "val/ratio_var": 0.01, "val/num_eos_tokens": 8, "lr": 1e-5, "epoch": 0.1 * i,
            "step": i + 1} for i in range(n)]
    log.append({"step": n, "epoch": 0.7, "train_runtime": 120.0, "total_flos": 0.0, "train_loss": 0.0})
    return {"global_step": n, "max_steps": n, "log_history": log}


def test_trl_names_are_mapped_to_rlhfkit_names():
    rows = with_iterations(_trl_ppo_state()["log_history"])
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]  # the summary row is not an iteration
    mapped, kind, used = rename(rows)
    assert kind == "TRL PPO" and "policy/clipfrac_avg -> params/policy_clip_frac" in used
    first = mapped[0]
    assert first["params/policy_clip_frac"] == 0.6 and first["rollout/kl"] == 0.5 and first["loss/value"] == 0.05
    assert first["rollout/reward_mean"] == 0.25 and first["params/approx_kl"] == 0.02 and first["params/lr"] == 1e-5
    assert "rollout/entropy" in first and first["rollout/entropy"] == 2.0  # policy/entropy_avg, not objective/entropy
    same, none, _ = rename(healthy_ppo(3))
    assert none is None and same == healthy_ppo(3)  # rlhfkit's own rows are left alone


def test_doctor_reads_a_trl_output_folder(tmp_path, capsys):
    out = tmp_path / "trl-ppo"
    (out / "checkpoint-3").mkdir(parents=True)
    (out / "checkpoint-3" / "trainer_state.json").write_text(json.dumps(_trl_ppo_state(3)))
    (out / "checkpoint-7").mkdir()
    (out / "checkpoint-7" / "trainer_state.json").write_text(json.dumps(_trl_ppo_state(7)))
    assert doctor_main([str(out)]) == 1  # the newest checkpoint's log: 7 iterations, a critical clip fraction
    text = capsys.readouterr().out
    assert "7 iterations (last 7), a TRL PPO log" in text and "names mapped: " in text
    assert "Findings recomputed from trainer_state.json:" in text
    assert "policy_clip_frac" in text and "value_loss_not_learning" in text
    assert doctor_main([str(out / "checkpoint-7" / "trainer_state.json"), "--json"]) == 1
    rules = {f["rule"] for f in json.loads(capsys.readouterr().out)}
    assert {"policy_clip_frac", "value_loss_not_learning"} <= rules


def test_doctor_reads_a_trl_grpo_jsonl_log(tmp_path, capsys):
    log = tmp_path / "grpo.jsonl"
    rows = [{"step": 10 * (i + 1), "reward": 0.3 + 0.01 * i, "reward_std": 0.3, "frac_reward_zero_std": 0.1,
             "completions/mean_length": 60.0, "completions/clipped_ratio": 0.1 if i < 5 else 0.7,
             "clip_ratio/region_mean": 0.01, "entropy": 1.5, "grad_norm": 0.5, "learning_rate": 1e-6, "loss": 0.0}
            for i in range(10)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(log)
    assert run.source == "TRL GRPO" and run.metrics[0]["iteration"] == 10
    assert run.metrics[0]["rollout/stop_fraction"] == 0.9 and abs(run.metrics[-1]["rollout/stop_fraction"] - 0.3) < 1e-12
    assert run.metrics[0]["rollout/group_reward_std"] == 0.3 and "rollout/reward_std" not in run.metrics[0]
    assert doctor_main([str(log), "--json"]) == 1
    found = {f["rule"]: f for f in json.loads(capsys.readouterr().out)}
    assert found["stop_fraction_falling"]["severity"] == "critical"  # 0.9 -> 0.3: most lost their stop token


def test_docs_list_every_mapped_name():
    from pathlib import Path

    from rlhfkit.diagnostics.foreign import KINDS

    text = (Path(__file__).resolve().parents[2] / "docs" / "diagnostics.md").read_text(encoding="utf-8")
    section = text[text.index("### Logs from other tools") :]
    for kind, (_, mapping) in KINDS.items():
        for theirs, (ours, _) in mapping.items():
            assert f"`{theirs}`" in section and f"`{ours}`" in section, (kind, theirs, ours)
