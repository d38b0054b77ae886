"""PPO update rules: clip fractions, per-update KL, the first-micro-batch ratio, the critic.

These encode the expert reading of seed 001 ("policy_clip_frac rising from 0.6 to 0.8 ... a
flat value loss means the critic is not learning ... reduce the learning rate 5-10x").
GRPO logs the same params/* keys, so the policy rules apply to it too.
"""

from __future__ import annotations

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import History, fmt, iterations, mean, rel_change, values
from rlhfkit.diagnostics.rules import finding, rule
from rlhfkit.diagnostics.rules.common import lr_hint
from rlhfkit.diagnostics.thresholds import Thresholds

CLIP = "params/policy_clip_frac"
VALUE_CLIP = "params/value_clip_frac"
APPROX_KL = "params/approx_kl"
RATIO_DEV = "params/ratio_first_microbatch_maxdev"
VALUE_LOSS = "loss/value"
REWARD = "rollout/reward_mean"
REWARD_STD = "rollout/reward_std"


@rule("policy_clip_frac", metrics=(CLIP,), trainers=("ppo", "grpo"),
      summary="policy clip fraction high or rising")
def policy_clip_frac(h: History, t: Thresholds) -> list[Finding]:
    """Recent mean of params/policy_clip_frac above clip_frac_warn/critical, or risen by
    clip_frac_rise within the last clip_rise_window iterations."""
    if h.current(CLIP) is None:
        return []
    k = t.recent_iterations
    recent = h.tail(CLIP, k)
    if len(recent) < k:
        return []
    level = mean(recent)
    severity, score = None, 0.0
    if level > t.clip_frac_warn:
        severity = "critical" if level > t.clip_frac_critical else "warning"
        score = level / t.clip_frac_warn
    window = h.tail(CLIP, t.clip_rise_window)
    rise = None
    if len(window) >= max(t.clip_rise_window, 2 * k):
        rise = mean(window[-k:]) - mean(window[:k])
        if rise >= t.clip_frac_rise and severity is None:
            severity, score = "warning", rise / t.clip_frac_rise
    if severity is None:
        return []
    msg = f"policy clip fraction averages {fmt(level)} over iterations {recent[0][0]}-{recent[-1][0]}"
    if rise is not None and rise > 0:
        msg += f", up from {fmt(mean(window[:k]))} at iterations {window[0][0]}-{window[k - 1][0]}"
    msg += f" (healthy: < {fmt(t.clip_frac_warn)})"
    return finding(
        "policy_clip_frac", severity, h, msg,
        {"metric": CLIP, "iterations": iterations(recent), "values": values(recent), "mean": level,
         "threshold": t.clip_frac_critical if severity == "critical" else t.clip_frac_warn,
         "rise": rise, "window_iterations": iterations(window), "window_values": values(window)},
        "Policy updates are too aggressive: reduce the learning rate 5-10x" + lr_hint(h) +
        "; or use fewer PPO epochs / more mini-batches per epoch; check that advantages are "
        "whitened and rewards are of order 1.",
        score=score,
    )


@rule("value_clip_frac_high", metrics=(VALUE_CLIP,), trainers=("ppo",),
      summary="most value predictions are clipped")
def value_clip_frac_high(h: History, t: Thresholds) -> list[Finding]:
    """Recent mean of params/value_clip_frac above value_clip_frac_warn."""
    if h.current(VALUE_CLIP) is None:
        return []
    recent = h.tail(VALUE_CLIP, t.recent_iterations)
    if len(recent) < t.recent_iterations or mean(recent) <= t.value_clip_frac_warn:
        return []
    level = mean(recent)
    return finding(
        "value_clip_frac_high", "warning", h,
        f"value clip fraction averages {fmt(level)} over iterations {recent[0][0]}-{recent[-1][0]}: "
        "the critic's updates are mostly clipped away",
        {"metric": VALUE_CLIP, "iterations": iterations(recent), "values": values(recent),
         "mean": level, "threshold": t.value_clip_frac_warn},
        "Value targets are large compared with the value clip range: scale or whiten rewards, "
        "initialise the value head at zero (or from the reward model), widen cliprange_value or "
        "turn value clipping off.",
        score=level / t.value_clip_frac_warn,
    )


@rule("approx_kl_high", metrics=(APPROX_KL,), trainers=("ppo", "grpo"),
      summary="per-update KL between old and new policy too large")
def approx_kl_high(h: History, t: Thresholds) -> list[Finding]:
    """params/approx_kl at the current iteration above approx_kl_warn/critical."""
    cur = h.current(APPROX_KL)
    if cur is None or cur <= t.approx_kl_warn:
        return []
    severity = "critical" if cur > t.approx_kl_critical else "warning"
    return finding(
        "approx_kl_high", severity, h,
        f"approx KL of one update is {fmt(cur)} nats/token at iteration {h.iteration} "
        f"(healthy: < {fmt(t.approx_kl_warn)})",
        {"metric": APPROX_KL, "iterations": [h.iteration], "values": [cur],
         "threshold": t.approx_kl_critical if severity == "critical" else t.approx_kl_warn},
        "Each update moves the policy too far: lower the learning rate" + lr_hint(h) +
        ", use fewer PPO epochs, or stop an epoch early when approx_kl exceeds a target "
        "(target_kl ~0.02-0.05); learning-rate warm-up avoids a spike in the first iterations.",
        score=cur / t.approx_kl_warn,
    )


@rule("ratio_first_microbatch", metrics=(RATIO_DEV,), trainers=("ppo", "grpo"),
      summary="ratio new/old is not 1 before the first update")
def ratio_first_microbatch(h: History, t: Thresholds) -> list[Finding]:
    """params/ratio_first_microbatch_maxdev = max |ratio - 1| on the first micro-batch, before
    any weight changed: must be float error. Anything else means old and new log-probs are
    computed differently (correctness pitfall 4)."""
    cur = h.current(RATIO_DEV)
    if cur is None or cur <= t.ratio_dev_warn:
        return []
    severity = "critical" if cur > t.ratio_dev_critical else "warning"
    return finding(
        "ratio_first_microbatch", severity, h,
        f"max |ratio - 1| on the first micro-batch is {fmt(cur)} at iteration {h.iteration}; "
        "before any update it must be ~0",
        {"metric": RATIO_DEV, "iterations": [h.iteration], "values": [cur],
         "threshold": t.ratio_dev_critical if severity == "critical" else t.ratio_dev_warn},
        "Rollout and update log-probs disagree: check the logits slice [p-1 : p+r-1], that dropout "
        "is off in every model, that logits are divided by the sampling temperature in both "
        "passes, position ids from the attention mask, and identical padding. In bf16, compare "
        "with an fp32 run before suspecting code.",
        score=cur / t.ratio_dev_warn,
    )


@rule("value_loss_not_learning", metrics=(VALUE_LOSS, REWARD, REWARD_STD), trainers=("ppo",),
      summary="value loss flat or rising while rewards move")
def value_loss_not_learning(h: History, t: Thresholds) -> list[Finding]:
    """Over the last value_window iterations: the mean reward moved (>= value_reward_move
    reward stds) but the value loss fell by less than value_flat_rel (flat) or rose by more
    than value_rise_rel; silent when the value loss is already below value_learned_frac times
    the reward variance."""
    w = t.value_window
    if h.current(VALUE_LOSS) is None or h.current(REWARD) is None:
        return []
    vl, rw = h.tail(VALUE_LOSS, w), h.tail(REWARD, w)
    if len(vl) < w or len(rw) < w:
        return []
    k = max(1, w // 3)
    vl_first, vl_last = mean(vl[:k]), mean(vl[-k:])
    r_first, r_last = mean(rw[:k]), mean(rw[-k:])
    std_pts = h.tail(REWARD_STD, w)
    scale = mean(std_pts) if std_pts else None
    move = abs(r_last - r_first)
    if scale is not None and scale > 0:
        if move < t.value_reward_move * scale or vl_last <= t.value_learned_frac * scale**2:
            return []
    elif move < t.value_reward_move * max(abs(r_first), 1e-12):
        return []
    if vl_first <= 1e-12:
        # A zero start (zero-initialised value head on all-zero rewards) makes any relative
        # change infinite and meaningless: seen as "rose 2.7e+10%" on a tiny run.
        return []
    change = rel_change(vl_last, vl_first)
    if change >= t.value_rise_rel:
        trend = f"rose {fmt(100 * change)}%"
    elif change > -t.value_flat_rel:
        trend = "stayed flat" if change < t.value_flat_rel else f"rose {fmt(100 * change)}%"
    else:
        return []
    return finding(
        "value_loss_not_learning", "warning", h,
        f"value loss {trend} ({fmt(vl_first)} -> {fmt(vl_last)}) over iterations "
        f"{vl[0][0]}-{vl[-1][0]} while the mean reward moved {fmt(r_first)} -> {fmt(r_last)}: "
        "the critic is not tracking the returns",
        {"metric": VALUE_LOSS, "iterations": iterations(vl), "values": values(vl),
         "value_loss_first": vl_first, "value_loss_last": vl_last, "relative_change": change,
         "reward_first": r_first, "reward_last": r_last, "reward_std": scale},
        "A critic that does not learn gives noisy advantages: check the value loss and GAE "
        "(returns = advantages + values computed before whitening, masked positions), give the "
        "value head a higher learning rate or vf_coef, initialise it at zero, and make sure value "
        "clipping is not freezing it (params/value_clip_frac).",
        score=1.0 + max(change, 0.0),
    )
