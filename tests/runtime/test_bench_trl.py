"""bench/bench_trl.py: the work given in TRL's names builds the same sizes on both sides; the ratio arithmetic worked
by hand; `--smoke` runs both trainers of every algorithm on the tiny model and prints the ratio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import bench_trl  # noqa: E402


def test_summary_is_the_ratio_of_the_mean_cpu_seconds():
    one = {"units": 2, "wall_s": 9.0}
    per_side = {"rlhfkit": [{**one, "cpu_s": 2.0}, {**one, "cpu_s": 4.0}],
                "trl": [{**one, "cpu_s": 5.0}, {**one, "cpu_s": 7.0}]}
    s = bench_trl.summary(per_side)
    # means: rlhfkit (2 + 4) / 2 = 3, TRL (5 + 7) / 2 = 6 -> 6 / 3 = 2; rounds 5 / 2 = 2.5 and 7 / 4 = 1.75
    assert s["ratio"] == pytest.approx(2.0, rel=1e-12)
    assert s["rounds"] == pytest.approx([2.5, 1.75], rel=1e-12)
    assert (s["rlhfkit_cpu_s"], s["trl_cpu_s"], s["trl_wall_s"]) == (3.0, 6.0, 9.0)
    # a failed side: no ratio, the row says why
    failed = {"rlhfkit": ["failed: ConfigError: x"], "trl": [{**one, "cpu_s": 5.0}]}
    assert bench_trl.summary(failed) is None
    assert "| dpo-full-fp32 | rlhfkit: failed: ConfigError: x |" in bench_trl.table({"dpo-full-fp32": failed})


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_the_trl_names_build_the_same_work_on_both_sides(adapter, monkeypatch):
    trl = pytest.importorskip("trl")
    import rlhfkit

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    args = bench_trl.work("grpo", adapter, smoke=False, steps=3)
    ours = rlhfkit.GRPOConfig(**args)
    theirs = trl.GRPOConfig(output_dir="unused", use_cpu=True, **{k: v for k, v in args.items() if k != "peft_config"})
    # P=2, A=2: TRL generates P x A = 4 completions (one prompt x num_generations 4) for one optimiser step of 4
    assert (theirs.generation_batch_size, theirs.steps_per_generation, theirs.num_iterations) == (4, 2, 1)
    assert (ours.rollout_batch_size, ours.mini_batch_size, ours.micro_batch_size, ours.update_epochs) == (4, 4, 2, 1)
    assert (ours.group_size, ours.max_new_tokens, ours.iterations, ours.warmup_steps) == (4, 16, 3, 0)
    assert ours.lora is (adapter == "lora")
    for algo, cls in (("dpo", "DPOConfig"), ("sft", "SFTConfig"), ("kto", "KTOConfig")):
        cfg = getattr(rlhfkit, cls)(**bench_trl.work(algo, adapter, smoke=False, steps=3))
        assert (cfg.batch_size, cfg.micro_batch_size, cfg.max_steps) == (4, 2, 3)


def test_smoke_runs_both_sides_of_every_algorithm(tiny_model_dir, tmp_path):
    pytest.importorskip("trl")
    saved = tmp_path / "results.json"
    cases = ["grpo-lora-bf16", "dpo-full-fp32", "sft-lora-fp32", "kto-full-bf16"]
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent / "src"), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, str(BENCH / "bench_trl.py"), "--smoke", "--model", str(tiny_model_dir),
                           "--cases", ",".join(cases), "--json", str(saved)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(saved.read_text())["results"]
    assert list(results) == cases
    for case in cases:
        for side in bench_trl.SIDES:
            (run,) = results[case][side]  # one round
            assert isinstance(run, dict), f"{case} {side}: {run}"
            assert run["units"] == 1 and run["cpu_s"] > 0  # 2 steps, the warm-up left out
        row = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"| {case} |"))
        assert "x** |" in row  # the ratio
    assert "docs/benchmarks.md left alone" in proc.stdout
