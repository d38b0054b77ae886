"""Synthetic metric histories for the diagnostics tests: healthy runs per trainer, and helpers
to inject one problem at a time. Deterministic (seeded)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def healthy_ppo(n: int = 30, seed: int = 0) -> list[Row]:
    """A PPO run that learns: reward rises, value loss falls, KL grows within budget, clip
    fractions and grad norms stay normal, length and stopping stable."""
    rng = random.Random(seed)

    def noise(s: float) -> float:
        return rng.gauss(0.0, s)

    rows = []
    for i in range(n):
        f = i / max(1, n - 1)
        entropy = 1.8 - 0.4 * f + noise(0.03)
        value = 0.12 * math.exp(-i / 6.0) * (1 + noise(0.03))  # a critic learns per iteration, whatever the run's length
        reward = 0.1 + 0.5 * f + noise(0.02)
        rows.append({
            "iteration": i,
            "rollout/reward_mean": reward,
            "rollout/reward_std": 0.4 + noise(0.01),
            "rollout/score_mean": reward + 0.05,
            "rollout/kl": 0.05 + 3.0 * f + abs(noise(0.05)),
            "rollout/response_length": 22 + noise(1.0),
            "rollout/stop_fraction": min(1.0, 0.9 + noise(0.02)),
            "rollout/entropy": entropy,
            "loss/policy": -0.01 + noise(0.005),
            "loss/value": value,
            "loss/entropy": -entropy,
            "loss/total": -0.01 + 0.1 * value - 0.01 * entropy,
            "params/policy_clip_frac": 0.06 + abs(noise(0.01)),
            "params/value_clip_frac": 0.1 + abs(noise(0.02)),
            "params/approx_kl": 0.02 + abs(noise(0.005)),
            "params/grad_norm": 2.5 + noise(0.3),
            "params/max_grad_norm": 1.0,
            "params/kl_coef": 0.05,
            "params/lr": 1e-5,
            "params/ratio_first_microbatch_maxdev": 1e-6,
            "rollout/explained_variance": 0.6 * (1 - math.exp(-i / 4.0)),  # a zero head reads 0, then it learns
            "timing/rollout_s": 5.0 + abs(noise(0.3)),
            "timing/update_s": 3.0 + abs(noise(0.2)),
            "throughput/tokens_per_s": 400 + noise(10),
        })
    return rows


def healthy_grpo(n: int = 30, seed: int = 1) -> list[Row]:
    rng = random.Random(seed)
    rows = healthy_ppo(n, seed)
    for i, r in enumerate(rows):
        for k in ("loss/value", "params/value_clip_frac", "rollout/explained_variance"):
            del r[k]
        r["rollout/group_reward_std"] = 0.3 + rng.gauss(0, 0.02)
        r["rollout/solved_fraction"] = 0.2 + 0.4 * i / (n - 1)
    return rows


def healthy_dpo(n: int = 30, seed: int = 2) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        f = i / (n - 1)
        ch, rj = 0.5 * f + rng.gauss(0, 0.02), -0.5 * f + rng.gauss(0, 0.02)
        rows.append({"iteration": i, "rewards/chosen": ch, "rewards/rejected": rj,
                     "rewards/accuracy": 0.5 + 0.3 * f + rng.gauss(0, 0.02), "rewards/margin": ch - rj,
                     "logps/chosen": -80 + f + rng.gauss(0, 0.3), "logps/rejected": -85 - 10 * f,
                     "loss/dpo": 0.69 - 0.24 * f + rng.gauss(0, 0.01), "params/grad_norm": 1.0 + rng.gauss(0, 0.1),
                     "params/max_grad_norm": 1.0, "params/lr": 5e-7})
    return rows


def healthy_rm(n: int = 30, seed: int = 3) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        f = i / (n - 1)
        rows.append({"iteration": i, "rm/accuracy": 0.6 + 0.2 * f + rng.gauss(0, 0.02),
                     "rm/margin": 0.1 + f, "rm/chosen_mean": 0.5 * f, "rm/rejected_mean": -0.5 * f,
                     "loss/rm": 0.69 - 0.2 * f + rng.gauss(0, 0.01), "params/grad_norm": 3 + rng.gauss(0, 0.3),
                     "params/max_grad_norm": 1.0, "params/lr": 1e-5})
    return rows


def healthy_sft(n: int = 30, seed: int = 4) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        f = i / (n - 1)
        row = {"iteration": i, "loss/sft": 2.5 - 0.7 * f + rng.gauss(0, 0.03),
               "params/grad_norm": 1.5 + rng.gauss(0, 0.1), "params/lr": 2e-5}
        if i % 5 == 4:
            row["eval/loss"] = 2.6 - 0.5 * f
            row["eval/perplexity"] = math.exp(row["eval/loss"])
        rows.append(row)
    return rows


def healthy_distill(n: int = 30, seed: int = 5) -> list[Row]:
    """On-policy distillation: the reverse KL to the teacher falls, the student's entropy stays."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        f = i / max(n - 1, 1)
        rows.append({"iteration": i, "distill/reverse_kl": 0.4 - 0.25 * f + rng.gauss(0, 0.02),
                     "loss/distill": 0.4 - 0.25 * f + rng.gauss(0, 0.02), "rollout/on_policy": 1.0,
                     "rollout/entropy": 1.5 - 0.3 * f + rng.gauss(0, 0.03), "rollout/score_mean": 0.1 + 0.3 * f,
                     "rollout/response_length": 10 + rng.gauss(0, 0.3), "params/grad_norm": 0.5 + rng.gauss(0, 0.05),
                     "params/max_grad_norm": 1.0, "params/lr": 3e-4})
    return rows


HEALTHY: dict[str, Callable[[], list[Row]]] = {
    "ppo": healthy_ppo, "grpo": healthy_grpo, "dpo": healthy_dpo, "rm": healthy_rm, "sft": healthy_sft,
    "distill": healthy_distill,
}


def with_values(rows: list[Row], key: str, fn: Callable[[int, Any], Any], start: int = 0) -> list[Row]:
    """A copy of ``rows`` with ``row[key] = fn(iteration, old value)`` from iteration ``start``."""
    out = []
    for r in rows:
        r = dict(r)
        if r["iteration"] >= start:
            r[key] = fn(r["iteration"], r.get(key))
        out.append(r)
    return out


def samples_for(rows: list[Row], per_iteration: int = 2, every: int = 5) -> list[Row]:
    out = []
    for r in rows:
        i = r["iteration"]
        if i % every:
            continue
        for k in range(per_iteration):
            out.append({"iteration": i, "prompt": f"Review #{k}: the movie was",
                        "completion": f"great fun <script>alert({i})</script> & more {k}",
                        "reward": round(0.1 * i / 3 + 0.05 * k, 4), "score": round(0.1 * i / 3, 4)})
    return out


def write_run(root: Path, name: str, rows: list[Row], *, samples: list[Row] | None = None,
              config: dict | None = None, summary: dict | None = None) -> Path:
    """A run folder as the trainers write it (non-finite floats as strings, like the Tracker)."""
    import yaml

    run = root / name
    run.mkdir(parents=True, exist_ok=True)

    def clean(v: Any) -> Any:
        return str(v) if isinstance(v, float) and not math.isfinite(v) else v

    (run / "metrics.jsonl").write_text("".join(json.dumps({k: clean(v) for k, v in r.items()}) + "\n" for r in rows))
    if samples is not None:
        (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    cfg = config if config is not None else {"command": "ppo", "model": "smollm2-135m", "lr": 1e-5,
                                             "kl_coef": 0.05, "run_name": name, "lora": True}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run
