"""`rlhfkit pipeline`: config loading and the SFT -> prefs -> RM -> PPO -> eval wiring with tiny models."""

from __future__ import annotations

import json

import pytest

from rlhfkit.commands.pipeline import STAGES, load_pipeline_config, main, run_pipeline, stage_configs
from rlhfkit.errors import ConfigError

REWARD = "def vowels(prompts, completions, **kw):\n" \
         "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n"


def _argv(tmp_path, model_dir) -> list[str]:
    (tmp_path / "gt.py").write_text(REWARD)
    return [f"model={model_dir}", f"output_dir={tmp_path / 'out'}", "dtype=fp32", "quiet=true",
            f"ground_truth=python:{tmp_path / 'gt.py'}:vowels",
            "sft.max_steps=2", "sft.max_length=96", "sft.max_eval_examples=4", "sft.tensorboard=false",
            "prefs.num_prompts=6", "prefs.max_new_tokens=8", "prefs.min_gap=0",
            "rm.epochs=1", "rm.max_length=96", "rm.tensorboard=false", "rm.lora_layers=2",  # the tiny model has 2
            "ppo.iterations=1", "ppo.max_new_tokens=6", "ppo.rollout_batch_size=4", "ppo.mini_batch_size=4",
            "ppo.micro_batch_size=2", "ppo.tensorboard=false",
            "eval.num_prompts=3", "eval.max_new_tokens=6", "eval.temperature=1.0"]


def test_pipeline_end_to_end_skips_complete_stages_and_reruns_stale_ones(tmp_path, tiny_model_dir, capsys):
    argv = _argv(tmp_path, tiny_model_dir)
    out = tmp_path / "out"
    result = run_pipeline(load_pipeline_config(argv))
    assert all(not result["stages"][s]["skipped"] for s in STAGES)
    # Wiring: every stage consumed the previous stage's output.
    sft_model = str(out / "sft" / "final" / "merged")
    prefs_cfg = (out / "rm" / "config.yaml").read_text()
    assert f"model: {sft_model}" in prefs_cfg and f"data: {out / 'prefs' / 'prefs.jsonl'}" in prefs_cfg
    ppo_cfg = (out / "ppo" / "config.yaml").read_text()
    assert f"reward: model:{out / 'rm' / 'final'}" in ppo_cfg and f"model: {sft_model}" in ppo_cfg
    adapter = json.loads((out / "ppo" / "final" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == sft_model  # the PPO adapter sits on the SFT model
    pairs = [json.loads(line) for line in (out / "prefs" / "prefs.jsonl").read_text().splitlines()]
    assert pairs and all(p["scores"]["chosen"] > p["scores"]["rejected"] for p in pairs)
    report = json.loads((out / "eval" / "report.json").read_text())
    assert report["config"]["model"] == str(out / "ppo" / "final") and report["config"]["ref_model"] == sft_model
    for who in ("model", "reference"):
        assert {"reward/learned_rm", "reward/ground_truth"} <= set(report[who])
    assert set(report["win_rate"]) == {"learned_rm", "ground_truth"}
    table = (out / "summary.md").read_text()
    assert "reward/learned_rm (mean)" in table and "win rate vs start, judged by ground_truth" in table
    assert "reward/ground_truth (mean)" in capsys.readouterr().out

    # Second run: everything is complete, nothing runs.
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and "summary" not in p.name}
    again = run_pipeline(load_pipeline_config(argv))
    assert all(again["stages"][s]["skipped"] for s in STAGES)
    assert all(p.stat().st_mtime_ns == t for p, t in mtimes.items() if p.exists() and p.name != "pipeline.yaml")

    # A changed RM option reruns rm and everything downstream of it, not sft/prefs.
    third = run_pipeline(load_pipeline_config(argv + ["rm.lr=2e-4"]))
    assert [s for s in STAGES if not third["stages"][s]["skipped"]] == ["rm", "ppo", "eval"]

    # An interrupted stage (no marker) reruns; an unrelated logging key does not invalidate.
    (out / "eval" / "rlhfkit_stage.json").unlink()
    fourth = run_pipeline(load_pipeline_config(argv + ["rm.lr=2e-4", "ppo.quiet=false"]))
    assert [s for s in STAGES if not fourth["stages"][s]["skipped"]] == ["eval"]


def test_default_config_validates_and_links_stages(tmp_path):
    cfg = load_pipeline_config([f"output_dir={tmp_path}", "dtype=fp32"])
    configs = stage_configs(cfg)
    assert list(configs) == list(STAGES)
    sft, prefs, rm, ppo, ev = (configs[s] for s in STAGES)
    assert sft.model == "smollm2-135m-instruct" and sft.data == "builtin:instructions" and sft.save_merged
    merged = str(tmp_path.resolve() / "sft" / "final" / "merged")
    assert prefs.model == rm.model == ppo.model == ev.ref_model == merged
    assert prefs.prompts == ppo.prompts == ev.prompts == "builtin:reviews" and prefs.scorer == "sentiment"
    assert rm.data == prefs.out and ppo.reward == f"model:{tmp_path.resolve() / 'rm' / 'final'}"
    assert ev.rewards == [f"learned_rm={ppo.reward}", "ground_truth=sentiment"] and ev.split == "test"
    # Without SFT the policy is the base model.
    configs = stage_configs(load_pipeline_config([f"output_dir={tmp_path}", "stages=[prefs, rm, ppo, eval]"]))
    assert "sft" not in configs and configs["ppo"].model == "smollm2-135m-instruct"


def test_config_errors(tmp_path, capsys):
    with pytest.raises(ConfigError, match="unknown pipeline key 'sfft' \\(did you mean 'sft'\\?\\)"):
        load_pipeline_config(["sfft.max_steps=3"])
    with pytest.raises(ConfigError, match="pipeline section 'ppo'.*unknown config key 'iteration'"):
        stage_configs(load_pipeline_config(["ppo.iteration=3"]))
    bad = tmp_path / "p.yaml"
    bad.write_text("rm:\n  lr: fast\n")
    with pytest.raises(ConfigError, match="lr='fast': expected float"):
        stage_configs(load_pipeline_config([str(bad)]))
    with pytest.raises(ConfigError, match="unknown stage 'dpo'"):
        load_pipeline_config(["stages=[sft, dpo]"])
    user = tmp_path / "u.yaml"
    user.write_text("ppo:\n  iterations: 3\n")
    merged = load_pipeline_config([str(user), "ppo.kl_coef=0.1"])
    assert merged["ppo"]["iterations"] == 3 and merged["ppo"]["kl_coef"] == 0.1
    assert merged["ppo"]["rollout_batch_size"] == 16  # the rest of the packaged default stays
    assert main(["--help"]) == 0 and "rlhfkit pipeline" in capsys.readouterr().out
