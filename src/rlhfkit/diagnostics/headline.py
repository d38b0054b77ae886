"""What a reader of a run wants first: the before/after evaluation with its metric named, the
key charts, the samples before and after side by side, and the settings that differ from the
defaults. Used by the HTML report and the exported model card."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# charts shown first, in this order (a name ending in "/" takes its whole namespace)
KEY_METRICS = ("rollout/reward_mean", "rollout/score_mean", "rollout/solved_fraction", "eval/", "loss/",
               "params/approx_kl", "rollout/kl", "params/policy_clip_frac", "rollout/entropy", "reward/")
LAST_GROUPS = ("timing", "throughput")  # cost, not learning: after everything else


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def eval_metric(config: dict[str, Any], on: str = "held-out") -> str:
    """What the before/after evaluation measures, named from the run's config; `on`: what it ran on,
    "held-out" or "training" prompts (summary.json's eval_on: data without a held-out split)."""
    held = "held-out" if on != "training" else "training-prompt"
    if config.get("env"):
        return f"episode reward (env={config['env']})"
    if config.get("reward") is not None:
        return f"{held} reward (reward={config['reward']})"
    if config.get("judge") is not None:
        return f"judged score of {held} samples (judge={config['judge']})"
    return f"{held} score"


def before_after(summary: dict[str, Any], config: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(metric name, before, after) for every number summary.json has both before and after training:
    `mean` becomes "mean held-out reward (reward=sentiment)", a plain number (DPO's judged mean) too."""
    b, a = summary.get("eval_before"), summary.get("eval_after")
    what = eval_metric(config, str(summary.get("eval_on", "held-out")))
    if _number(b) and _number(a):
        return [(f"mean {what}", float(b), float(a))]
    if not isinstance(b, dict) or not isinstance(a, dict):
        return []
    names = {"mean": f"mean {what}", "std": f"std of {what}", "n": "samples"}
    return [(names.get(k, k), float(b[k]), float(a[k])) for k in b if k in a and _number(b[k]) and _number(a[k])]


def paired_samples(summary: dict[str, Any], limit: int = 8) -> list[tuple[Any, dict, dict]]:
    """(prompt, before row, after row) from the evaluation's samples (the same prompts and seed)."""
    b = (summary.get("eval_before") or {}) if isinstance(summary.get("eval_before"), dict) else {}
    a = (summary.get("eval_after") or {}) if isinstance(summary.get("eval_after"), dict) else {}
    rows = zip(b.get("samples") or [], a.get("samples") or [])
    return [(x.get("prompt"), x, y) for x, y in rows if isinstance(x, dict) and isinstance(y, dict)][:limit]


def key_first(names: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Metric names as (section title, names): the key charts, then each namespace, cost last."""
    def is_key(m: str) -> bool:
        return any(m == k or (k.endswith("/") and m.startswith(k)) for k in KEY_METRICS)

    def rank(m: str) -> int:
        return next(i for i, k in enumerate(KEY_METRICS) if m == k or (k.endswith("/") and m.startswith(k)))

    key = sorted((m for m in names if is_key(m)), key=lambda m: (rank(m), names.index(m)))
    groups: dict[str, list[str]] = {}
    for m in names:
        if not is_key(m):
            groups.setdefault(m.split("/", 1)[0] if "/" in m else "other", []).append(m)
    ordered = sorted(groups, key=lambda g: g in LAST_GROUPS)
    return ([("key metrics", key)] if key else []) + [(f"{g}/", groups[g]) for g in ordered]


def differing_keys(configs: Sequence[dict[str, Any]], defaults: dict[str, Any] | None) -> list[str]:
    """Config keys whose values differ between runs, or (one run) from its command's defaults."""
    keys = list(dict.fromkeys(k for c in configs for k in c))
    if len(configs) > 1:
        return [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]
    if defaults is None:
        return []
    return [k for k in keys if k in defaults and configs[0].get(k) != defaults[k]
            and k not in ("run_name", "output_dir")]
