"""PPO update rules: clip fractions, per-update KL, the first-micro-batch ratio, the critic.

These encode how an experienced practitioner reads a run: a policy clip fraction rising from
0.6 to 0.8 is a red flag, a value loss that stays flat while the policy moves means the critic
is not learning, and the first fix is a 5-10x lower learning rate. GRPO logs the same params/*
keys, so the policy rules apply to it too.
"""

from __future__ import annotations

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import History, fmt, iterations, mean, median, rel_change, values
from rlhfkit.diagnostics.rules.common import lr_hint
from rlhfkit.diagnostics.rules.registry import finding, rule
from rlhfkit.diagnostics.thresholds import Thresholds

CLIP = "params/policy_clip_frac"
VALUE_CLIP = "params/value_clip_frac"
APPROX_KL = "params/approx_kl"
RATIO_DEV = "params/ratio_first_microbatch_maxdev"
VALUE_LOSS = "loss/value"
REWARD = "rollout/reward_mean"
REWARD_STD = "rollout/reward_std"
KL = "rollout/kl"
EXPLAINED_VAR = "rollout/explained_variance"
VALUE_MEAN = "rollout/value_mean"
RETURN_MEAN = "rollout/return_mean"


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
        "; or use fewer update epochs (ppo_epochs; GRPO: update_epochs) or larger mini-batches "
        "(mini_batch_size: fewer, less noisy optimiser steps per rollout; on the tiny model "
        "mini_batch_size=4 kept the clip fraction at 0.29-0.38, 16 brought it to 0.02-0.10); check that "
        "advantages are whitened (whiten_advantages=true) and scores are of order 1 (score_clip).",
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
        "Value targets are far from the old values compared with the value clip range: widen "
        "value_clip_eps towards the scale of rollout/return_mean, or set value_clip_eps=null to turn "
        "value clipping off; clip extreme scores with score_clip.",
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
        ", use fewer update epochs (ppo_epochs; GRPO: update_epochs) or a tighter clip_eps; "
        "learning-rate warm-up (warmup_steps) avoids a spike in the first iterations.",
        score=cur / t.approx_kl_warn,
    )


@rule("ratio_first_microbatch", metrics=(RATIO_DEV,), trainers=("ppo", "grpo"),
      summary="ratio new/old is not 1 before the first update")
def ratio_first_microbatch(h: History, t: Thresholds) -> list[Finding]:
    """params/ratio_first_microbatch_maxdev = max |ratio - 1| on the first micro-batch, before
    any weight changed: must be float error. Anything else means old and new log-probs are
    computed differently (docs/pitfalls.md#off-by-one)."""
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


def _what_moves(h: History, its: list[int], k: int, t: Thresholds, std: float | None) -> list[str]:
    """Why the critic's targets changed over iterations ``its`` (first k vs last k): the mean
    reward moved, the policy moved per update (approx_kl) or away from the reference (rollout/kl)."""
    moves = []
    rw = [p for p in h.series(REWARD) if p[0] in set(its)]
    if len(rw) >= 2 * k:
        r_first, r_last = mean(rw[:k]), mean(rw[-k:])
        scale = std if std else max(abs(r_first), 1e-12)
        if abs(r_last - r_first) >= t.value_reward_move * scale:
            moves.append(f"the mean reward moved {fmt(r_first)} -> {fmt(r_last)}")
    kl_upd = [v for i, v in h.series(APPROX_KL) if i in set(its)]
    if kl_upd and sum(kl_upd) / len(kl_upd) >= t.value_policy_kl:
        moves.append(f"the policy moved {fmt(sum(kl_upd) / len(kl_upd))} nats/token per update (approx_kl)")
    kl = [p for p in h.series(KL) if p[0] in set(its)]
    if len(kl) >= 2 * k and abs(mean(kl[-k:]) - mean(kl[:k])) >= t.value_kl_move:
        moves.append(f"the KL to the reference went {fmt(mean(kl[:k]))} -> {fmt(mean(kl[-k:]))} nats")
    return moves


def _baseline_only(h: History, its: list[int], t: Thresholds, std: float | None) -> dict | None:
    """Evidence that the critic over iterations ``its`` is a learned baseline: its mean value
    within value_baseline_gap reward standard deviations of the mean return, and the median of
    its explained variance not below explained_variance_warn (it does not add variance); None
    otherwise, or when the run does not log these metrics."""
    within = set(its)
    ev = [p for p in h.series(EXPLAINED_VAR) if p[0] in within]
    vm = [v for i, v in h.series(VALUE_MEAN) if i in within]
    rm = [v for i, v in h.series(RETURN_MEAN) if i in within]
    if not (std and ev and vm and rm):
        return None
    gap = abs(sum(vm) / len(vm) - sum(rm) / len(rm))
    level = median(ev)
    if gap > t.value_baseline_gap * std or level < t.explained_variance_warn:
        return None
    return {"value_mean_gap": gap, "explained_variance_median": level}


@rule("value_loss_not_learning", metrics=(VALUE_LOSS, REWARD, REWARD_STD, APPROX_KL, KL, EXPLAINED_VAR, VALUE_MEAN,
                                          RETURN_MEAN), trainers=("ppo",),
      summary="value loss flat or rising while the policy or the rewards move")
def value_loss_not_learning(h: History, t: Thresholds) -> list[Finding]:
    """Over the last value_window iterations the policy moved (approx_kl, rollout/kl) or the mean
    reward did, but the value loss did not fall by value_flat_rel (first third vs last third). A
    full window is judged as it is; a shorter one (from value_min_iterations on) only when the
    loss also stayed within value_flat_band of its mean, since a few noisy iterations can look
    like a rise. Silent when the value loss is already below value_learned_frac times the reward
    variance, or starts at 0. A flat loss of a critic that is a learned baseline (`_baseline_only`:
    its mean value follows the mean return, its explained variance is about 0) is reported as info:
    it learned what the returns share and cannot yet tell one answer's from another's."""
    if h.current(VALUE_LOSS) is None:
        return []
    vl = h.tail(VALUE_LOSS, t.value_window)
    if len(vl) < min(t.value_min_iterations, t.value_window):
        return []
    k = max(1, len(vl) // 3)
    vl_first, vl_last = mean(vl[:k]), mean(vl[-k:])
    if vl_first <= 1e-12:
        # A zero start (zero-initialised value head on all-zero rewards) makes any relative
        # change infinite and meaningless: seen as "rose 2.7e+10%" on a tiny run.
        return []
    its = iterations(vl)
    std_pts = [v for i, v in h.series(REWARD_STD) if i in set(its)]
    std = sum(std_pts) / len(std_pts) if std_pts else None
    if std and vl_last <= t.value_learned_frac * std**2:
        return []
    change = rel_change(vl_last, vl_first)
    level = mean(vl)
    steady = all(abs(v - level) <= t.value_flat_band * level for v in values(vl))
    if change <= -t.value_flat_rel or (len(vl) < t.value_window and not (steady and change < t.value_flat_rel)):
        return []
    moves = _what_moves(h, its, k, t, std)
    if not moves:
        return []
    baseline = _baseline_only(h, its, t, std) if change < t.value_flat_rel else None
    if baseline is not None:
        return finding(
            "value_loss_not_learning", "info", h,
            f"value loss stayed flat ({fmt(vl_first)} -> {fmt(vl_last)}) over iterations {its[0]}-{its[-1]} "
            f"while {' and '.join(moves)}, but the critic is a baseline: its mean value is within "
            f"{fmt(baseline['value_mean_gap'])} of the mean return (reward std {fmt(std)}) and its explained "
            f"variance has a median of {fmt(baseline['explained_variance_median'])}",
            {"metric": VALUE_LOSS, "iterations": its, "values": values(vl), "value_loss_first": vl_first,
             "value_loss_last": vl_last, "relative_change": change, "reward_std": std, "moves": moves,
             **baseline},
            "The advantages are then the returns less their mean, as without a critic: nothing is broken. "
            "Values that tell answers apart need returns the prefix predicts (a reward on the whole text "
            "is decided late), more answers per iteration (rollout_batch_size) or more iterations.",
            score=0.5,
        )
    if change < t.value_flat_rel:
        trend = "stayed flat"
    else:
        trend = f"{'rose' if change >= t.value_rise_rel else 'crept up'} {fmt(100 * change)}%"
    return finding(
        "value_loss_not_learning", "warning", h,
        f"value loss {trend} ({fmt(vl_first)} -> {fmt(vl_last)}) over iterations {its[0]}-{its[-1]} "
        f"while {' and '.join(moves)}: the critic is not tracking the returns",
        {"metric": VALUE_LOSS, "iterations": its, "values": values(vl),
         "value_loss_first": vl_first, "value_loss_last": vl_last, "relative_change": change,
         "reward_std": std, "moves": moves},
        "A critic that does not learn gives noisy advantages: check the value loss and GAE "
        "(returns = advantages + values computed before whitening, masked positions), raise "
        "value_head_lr (the value head's own Adam step size; vf_coef only weighs the shared layers' share), "
        "and make sure value clipping is not freezing it (params/value_clip_frac, value_clip_eps).",
        score=1.0 + max(change, 0.0),
    )


@rule("explained_variance_low", metrics=(EXPLAINED_VAR,), trainers=("ppo",),
      summary="the critic predicts the returns worse than their mean")
def explained_variance_low(h: History, t: Thresholds) -> list[Finding]:
    """Recent median of rollout/explained_variance (1 - Var(R - V) / Var(R)) below
    explained_variance_warn, judged from value_min_iterations logged values on. The median, not the
    mean: one iteration's figure from 16 answers swings by +-0.4 (measured on the default demo), and
    one such swing must not decide."""
    if h.current(EXPLAINED_VAR) is None or len(h.series(EXPLAINED_VAR)) < t.value_min_iterations:
        return []
    recent = h.tail(EXPLAINED_VAR, t.recent_iterations)
    level = median(recent)
    if level >= t.explained_variance_warn:
        return []
    return finding(
        "explained_variance_low", "warning", h,
        f"explained variance of the value head has a median of {fmt(level)} over iterations "
        f"{recent[0][0]}-{recent[-1][0]} "
        f"(below {fmt(t.explained_variance_warn)}): its values predict the returns worse than the returns' mean, so "
        "the advantages A = R - V are noisier than the returns themselves",
        {"metric": EXPLAINED_VAR, "iterations": iterations(recent), "values": values(recent), "median": level,
         "mean": mean(recent), "threshold": t.explained_variance_warn},
        "Values that jump between rollouts (a value loss that falls while this stays below 0) come from a "
        "value head stepping too far: lower value_head_lr (Adam moves each head weight by about that much per "
        "step, whatever vf_coef is). A critic that lags the policy (a flat value loss) needs a larger "
        "value_head_lr or smaller policy updates (fewer ppo_epochs, larger mini_batch_size, a lower lr); check "
        "that value clipping is not freezing it (params/value_clip_frac).",
        score=1.0 + (t.explained_variance_warn - level),
    )
