"""Rollout rules (PPO, GRPO, RLOO): KL to the reference, entropy, reward, length, stopping."""

from __future__ import annotations

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import History, Point, fmt, iterations, mean, values
from rlhfkit.diagnostics.rules.common import lr_hint
from rlhfkit.diagnostics.rules.registry import finding, rule
from rlhfkit.diagnostics.thresholds import Thresholds

KL = "rollout/kl"
KL_COEF = "params/kl_coef"
ENTROPY = "rollout/entropy"
REWARD = "rollout/reward_mean"
SCORE = "rollout/score_mean"
REWARD_STD = "rollout/reward_std"
LENGTH = "rollout/response_length"
STOP = "rollout/stop_fraction"


def baseline_and_recent(h: History, key: str, t: Thresholds) -> tuple[list[Point], list[Point]] | None:
    """(first baseline_iterations points, last recent_iterations points), non-overlapping, or
    None when the metric is absent now or has too few values."""
    if h.current(key) is None or h.count(key) < t.baseline_iterations + t.recent_iterations:
        return None
    return h.head(key, t.baseline_iterations), h.tail(key, t.recent_iterations)


def shift_evidence(key: str, base: list[Point], recent: list[Point], **more) -> dict:
    """A baseline-vs-recent finding's evidence: the metric, the points of both windows, the mean of
    each (baseline, recent), then `more` (its ratio, threshold, ...)."""
    return {"metric": key, "iterations": iterations(base) + iterations(recent),
            "values": values(base) + values(recent), "baseline": mean(base), "recent": mean(recent), **more}


def span(points: list[Point]) -> str:
    return f"{points[0][0]}-{points[-1][0]}" if len(points) > 1 else str(points[0][0])


def _reward_change(h: History, base: list[Point], recent: list[Point]) -> tuple[float, float] | None:
    """Mean reward over the same iterations as ``base`` and ``recent`` (for context)."""
    key = REWARD if h.count(REWARD) else SCORE
    pts = {i: v for i, v in h.series(key)}
    b = [pts[i] for i, _ in base if i in pts]
    r = [pts[i] for i, _ in recent if i in pts]
    if not b or not r:
        return None
    return sum(b) / len(b), sum(r) / len(r)


@rule("rollout_kl_high", metrics=(KL,), trainers=("ppo", "grpo"),
      summary="KL to the reference beyond the budget")
def rollout_kl_high(h: History, t: Thresholds) -> list[Finding]:
    """Recent mean of rollout/kl (per-sequence k1 vs the reference, nats) above rollout_kl_warn."""
    if h.current(KL) is None:
        return []
    recent = h.tail(KL, t.recent_iterations)
    level = mean(recent)
    if len(recent) < t.recent_iterations or level <= t.rollout_kl_warn:
        return []
    severity = "critical" if level > t.rollout_kl_critical else "warning"
    coef = h.current(KL_COEF)
    coef_txt = f" (kl_coef is {fmt(coef)})" if coef is not None else ""
    return finding(
        "rollout_kl_high", severity, h,
        f"KL to the reference averages {fmt(level)} nats/sequence over iterations {span(recent)}"
        f"{coef_txt} (budget: {fmt(t.rollout_kl_warn)})",
        {"metric": KL, "iterations": iterations(recent), "values": values(recent), "mean": level,
         "kl_coef": coef,
         "threshold": t.rollout_kl_critical if severity == "critical" else t.rollout_kl_warn},
        "The policy drifts far from the reference, where the reward is least trustworthy: raise "
        "kl_coef (GRPO: beta), lower the learning rate" + lr_hint(h) + ", and read the samples for reward "
        "hacking. PPO's adaptive_kl=true (kl_target=6) changes kl_coef by at most 20% per kl_horizon "
        "answers (default 10000): it steers runs of thousands of iterations, not a short one.",
        score=level / t.rollout_kl_warn,
    )


@rule("negative_kl", metrics=(KL,), trainers=("ppo", "grpo"),
      summary="mean k1 KL to the reference is negative")
def negative_kl(h: History, t: Thresholds) -> list[Finding]:
    """The last recent_iterations values of rollout/kl all negative with a mean below
    -negative_kl_tol. KL >= 0 and k1 is unbiased, so this is a log-prob bug, not noise."""
    if h.current(KL) is None:
        return []
    recent = h.tail(KL, t.recent_iterations)
    level = mean(recent)
    if len(recent) < t.recent_iterations or max(values(recent)) >= 0 or level >= -t.negative_kl_tol:
        return []
    severity = "critical" if level < -t.negative_kl_critical else "warning"
    return finding(
        "negative_kl", severity, h,
        f"mean k1 KL to the reference is negative ({fmt(level)} nats over iterations {span(recent)}); "
        "a true KL cannot be",
        {"metric": KL, "iterations": iterations(recent), "values": values(recent), "mean": level,
         "threshold": -t.negative_kl_critical if severity == "critical" else -t.negative_kl_tol},
        "Policy and reference log-probs are computed inconsistently: the same temperature must "
        "divide both logits; sample with top_k=0, top_p=1 (truncation breaks the estimate); "
        "dropout off in both models; the same position ids, padding and logits slice.",
        score=-level / t.negative_kl_tol,
    )


@rule("entropy_collapse", metrics=(ENTROPY,), trainers=("ppo", "grpo", "distill"),
      summary="token entropy collapsed relative to its start")
def entropy_collapse(h: History, t: Thresholds) -> list[Finding]:
    """Recent rollout/entropy below entropy_collapse_frac (warning) or entropy_critical_frac
    (critical) of its baseline."""
    pts = baseline_and_recent(h, ENTROPY, t)
    if pts is None:
        return []
    base, recent = pts
    b, r = mean(base), mean(recent)
    if b <= 0 or r >= t.entropy_collapse_frac * b:
        return []
    frac = r / b
    severity = "critical" if frac < t.entropy_critical_frac else "warning"
    return finding(
        "entropy_collapse", severity, h,
        f"token entropy fell from {fmt(b)} (iterations {span(base)}) to {fmt(r)} nats "
        f"(iterations {span(recent)}), {fmt(100 * frac)}% of its start: the policy is collapsing "
        "onto a few answers",
        shift_evidence(ENTROPY, base, recent, fraction=frac,
                       threshold=t.entropy_critical_frac if severity == "critical" else t.entropy_collapse_frac),
        "Read the samples: identical answers mean mode collapse or reward hacking. Raise kl_coef "
        "(GRPO: beta) or the entropy bonus ent_coef, lower the learning rate" + lr_hint(h) + ", and "
        "check that the rollout temperature and the entropy use the same temperature-scaled logits.",
        score=t.entropy_collapse_frac / max(frac, 1e-12),
    )


@rule("reward_flat", metrics=(REWARD, SCORE, REWARD_STD), trainers=("ppo", "grpo"),
      summary="reward flat for many iterations")
def reward_flat(h: History, t: Thresholds) -> list[Finding]:
    """The two halves of the last reward_flat_window iterations of rollout/reward_mean (else
    rollout/score_mean) differ by less than reward_flat_rel reward stds. Info for a plateau after
    progress, or for no progress yet; warning when the reward has still not risen above its
    baseline after 2 * reward_flat_window iterations (nothing learned)."""
    key = h.first_present(REWARD, SCORE)
    w = t.reward_flat_window
    if key is None or h.count(key) < w:
        return []
    window = h.tail(key, w)
    half = w // 2
    first, second = mean(window[:half]), mean(window[half:])
    std_pts = h.tail(REWARD_STD, w)
    scale = mean(std_pts) if std_pts and mean(std_pts) > 0 else max(abs(first), 1e-12)
    tol = t.reward_flat_rel * scale
    if abs(second - first) >= tol:
        return []
    base = mean(h.head(key, t.baseline_iterations))
    learned = second - base >= tol
    severity = "warning" if not learned and h.count(key) >= 2 * w else "info"
    if learned:
        msg = (f"{key} has plateaued at {fmt(second)} for {w} iterations ({span(window)}), up from "
               f"{fmt(base)} at the start")
        action = ("Training has converged for this reward: stop here (or raise the task difficulty / "
                  "the KL budget), and check the samples for reward hacking before trusting the gain.")
    else:
        msg = (f"{key} has not moved for {w} iterations ({span(window)}): {fmt(first)} -> {fmt(second)}, "
               f"start {fmt(base)}")
        action = ("The policy is not learning from this reward: read the samples (is the reward "
                  "varying at all? rollout/reward_std), raise the learning rate if params/policy_clip_frac "
                  "and params/approx_kl are tiny, lower kl_coef if it dominates the reward, and check "
                  "that the score lands on the last response token.")
    return finding(
        "reward_flat", severity, h, msg,
        {"metric": key, "iterations": iterations(window), "values": values(window),
         "first_half_mean": first, "second_half_mean": second, "baseline": base, "tolerance": tol},
        action, score=1.0,
    )


@rule("length_explosion", metrics=(LENGTH,), trainers=("ppo", "grpo"),
      summary="response length grew far above its start")
def length_explosion(h: History, t: Thresholds) -> list[Finding]:
    """Recent rollout/response_length at least length_explode_factor times its baseline."""
    pts = baseline_and_recent(h, LENGTH, t)
    if pts is None:
        return []
    base, recent = pts
    b, r = mean(base), mean(recent)
    if b <= 0 or r < t.length_explode_factor * b:
        return []
    rw = _reward_change(h, base, recent)
    ctx = ""
    if rw is not None:
        ctx = f"; mean reward {fmt(rw[0])} -> {fmt(rw[1])}"
        ctx += " (rising with length: possible length hacking)" if rw[1] > rw[0] else ""
    return finding(
        "length_explosion", "warning", h,
        f"mean response length grew from {fmt(b)} (iterations {span(base)}) to {fmt(r)} tokens "
        f"(iterations {span(recent)}){ctx}",
        shift_evidence(LENGTH, base, recent, ratio=r / b,
                       reward_baseline=rw[0] if rw else None, reward_recent=rw[1] if rw else None,
                       threshold=t.length_explode_factor),
        "Read the samples. If the reward rewards length, normalise it by length or add a length "
        "penalty; if answers no longer stop, check rollout/stop_fraction, stop_ids and "
        "no_stop_penalty; raise kl_coef to stay near the reference.",
        score=(r / b) / t.length_explode_factor,
    )


@rule("length_collapse", metrics=(LENGTH,), trainers=("ppo", "grpo"),
      summary="response length shrank far below its start")
def length_collapse(h: History, t: Thresholds) -> list[Finding]:
    """Recent rollout/response_length at most length_collapse_factor times its baseline
    (warning), or under length_min_tokens (critical: empty answers)."""
    pts = baseline_and_recent(h, LENGTH, t)
    if pts is None:
        return []
    base, recent = pts
    b, r = mean(base), mean(recent)
    empty = r < t.length_min_tokens
    if not empty and (b <= 0 or r > t.length_collapse_factor * b):
        return []
    severity = "critical" if empty else "warning"
    return finding(
        "length_collapse", severity, h,
        f"mean response length fell from {fmt(b)} (iterations {span(base)}) to {fmt(r)} tokens "
        f"(iterations {span(recent)})" + (": answers are (nearly) empty" if empty else ""),
        shift_evidence(LENGTH, base, recent, ratio=r / b if b > 0 else None,
                       threshold=t.length_min_tokens if empty else t.length_collapse_factor),
        "Read the samples: a reward that favours short answers (or penalises every token via the "
        "KL) teaches the policy to stop at once. Check the EOS handling (pad == eos: response "
        "masks must come from the generated tokens, not token == pad), that the stop token is "
        "inside the scored response, and never force a minimum length.",
        score=(t.length_collapse_factor * b / max(r, 1e-12)) if b > 0 else 1.0,
    )


@rule("stop_fraction_falling", metrics=(STOP,), trainers=("ppo", "grpo"),
      summary="fewer responses end with a stop token")
def stop_fraction_falling(h: History, t: Thresholds) -> list[Finding]:
    """Recent rollout/stop_fraction at least stop_drop_warn (critical: stop_drop_critical) below
    its baseline."""
    pts = baseline_and_recent(h, STOP, t)
    if pts is None:
        return []
    base, recent = pts
    b, r = mean(base), mean(recent)
    drop = b - r
    if drop < t.stop_drop_warn:
        return []
    severity = "critical" if drop >= t.stop_drop_critical else "warning"
    return finding(
        "stop_fraction_falling", severity, h,
        f"fraction of responses ending with a stop token fell from {fmt(b)} (iterations "
        f"{span(base)}) to {fmt(r)} (iterations {span(recent)})",
        shift_evidence(STOP, base, recent, drop=drop,
                       threshold=t.stop_drop_critical if severity == "critical" else t.stop_drop_warn),
        "Truncated answers get a score for half an answer: penalise responses that never stop "
        "(no_stop_penalty), check the configured stop_ids, raise max_new_tokens if answers "
        "legitimately grew, and look for rambling (length hacking) in the samples.",
        score=drop / t.stop_drop_warn,
    )
