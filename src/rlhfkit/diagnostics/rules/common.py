"""Rules for every trainer: non-finite values, gradient-norm explosions, loss spikes."""

from __future__ import annotations

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.history import History, fmt, iterations, median, values
from rlhfkit.diagnostics.rules.registry import finding, rule
from rlhfkit.diagnostics.thresholds import Thresholds

GRAD_NORM = "params/grad_norm"
MAX_GRAD_NORM = "params/max_grad_norm"
LR = "params/lr"
SPIKE_LOSSES = ("loss/value", "loss/sft", "loss/dpo", "loss/rm")


def lr_hint(h: History) -> str:
    """' (params/lr is 1e-05: try 1e-06 to 2e-06)' when the learning rate is logged, else ''."""
    lr = h.current(LR)
    if lr is None or lr <= 0:
        return ""
    return f" (params/lr is {fmt(lr)}: try {fmt(lr / 10)} to {fmt(lr / 5)})"


@rule("non_finite", metrics=("*",), trainers=("all",),
      summary="a metric is NaN or infinite")
def non_finite(h: History, t: Thresholds) -> list[Finding]:
    """Any NaN/inf metric at the current iteration. Critical: the weights are probably NaN now."""
    bad = h.nonfinite
    if not bad:
        return []
    names = sorted(bad)
    shown = ", ".join(f"{k}={bad[k]}" for k in names[:6]) + (" ..." if len(names) > 6 else "")
    return finding(
        "non_finite", "critical", h,
        f"non-finite metric values at iteration {h.iteration}: {shown}",
        {"metrics": names, "values": {k: bad[k] for k in names}, "iterations": [h.iteration]},
        "Stop the run: once a loss or gradient is NaN the weights usually are too. Resume from the "
        "last good checkpoint (--resume) with a lower learning rate" + lr_hint(h) + "; check for "
        "log(0) / division by a zero std (a batch of identical rewards), fp16 overflow (dtype=bf16 "
        "or dtype=fp32) and that gradient clipping is on (max_grad_norm).",
        score=len(names),
    )


@rule("grad_norm_explosion", metrics=(GRAD_NORM, MAX_GRAD_NORM), trainers=("all",),
      summary="gradient norm far above its own history or the clip threshold")
def grad_norm_explosion(h: History, t: Thresholds) -> list[Finding]:
    """params/grad_norm (before clipping) vs the median of its previous values and vs the clip
    threshold: params/max_grad_norm when logged, else the run's config.yaml (``h.defaults``),
    else ``default_max_grad_norm`` (1.0)."""
    cur = h.current(GRAD_NORM)
    if cur is None:
        return []
    prev = h.tail(GRAD_NORM, t.grad_norm_window, skip_current=True)
    vs_history = vs_clip = None
    if len(prev) >= t.grad_norm_min_history and median(prev) > 0:
        vs_history = cur / median(prev)
    clip, source = h.current_or_default(MAX_GRAD_NORM)
    if clip is None:
        clip, source = t.default_max_grad_norm, "assumed default"
    if clip > 0:
        vs_clip = cur / clip
    severity, parts = None, []
    score = 0.0
    if vs_history is not None and vs_history >= t.grad_norm_spike_warn:
        severity = "critical" if vs_history >= t.grad_norm_spike_critical else "warning"
        parts.append(f"{fmt(vs_history)}x its median {fmt(median(prev))} over iterations "
                     f"{prev[0][0]}-{prev[-1][0]}")
        score = vs_history / t.grad_norm_spike_warn
    if vs_clip is not None and vs_clip >= t.grad_norm_clip_warn:
        sev = "critical" if vs_clip >= t.grad_norm_clip_critical else "warning"
        if severity is None or sev == "critical":
            severity = sev
        where = "" if source == "logged" else f" ({source})"
        parts.append(f"{fmt(vs_clip)}x the clip threshold max_grad_norm={fmt(clip)}{where}")
        score = max(score, vs_clip / t.grad_norm_clip_warn)
    if severity is None:
        return []
    evidence = {"metric": GRAD_NORM, "iterations": [h.iteration], "values": [cur],
                "grad_norm": cur, "ratio_to_history": vs_history, "ratio_to_clip": vs_clip,
                "max_grad_norm": clip, "max_grad_norm_source": source,
                "history_iterations": iterations(prev), "history_values": values(prev)}
    return finding(
        "grad_norm_explosion", severity, h,
        f"gradient norm {fmt(cur)} (before clipping) is " + " and ".join(parts),
        evidence,
        "Updates are numerically unstable: reduce the learning rate 5-10x" + lr_hint(h) +
        ", keep gradient clipping on (max_grad_norm ~1), add learning-rate warm-up (warmup_steps), "
        "and check that rewards/advantages are scaled (whiten_advantages=true, scores of order 1: "
        "score_clip).",
        score=score,
    )


@rule("loss_spike", metrics=SPIKE_LOSSES, trainers=("ppo", "sft", "dpo", "rm"),
      summary="a non-negative loss jumps far above its recent median")
def loss_spike(h: History, t: Thresholds) -> list[Finding]:
    """loss/value, loss/sft, loss/dpo, loss/rm at the current iteration vs the median of the
    previous ``loss_spike_window`` values (one finding per loss, keyed by metric)."""
    out: list[Finding] = []
    for key in SPIKE_LOSSES:
        cur = h.current(key)
        prev = h.tail(key, t.loss_spike_window, skip_current=True)
        if cur is None or len(prev) < max(3, t.loss_spike_window // 2):
            continue
        base = median(prev)
        if base <= 0 or cur < t.loss_spike_warn * base:
            continue
        ratio = cur / base
        severity = "critical" if ratio >= t.loss_spike_critical else "warning"
        out += finding(
            "loss_spike", severity, h,
            f"{key} jumped to {fmt(cur)}, {fmt(ratio)}x its median {fmt(base)} over iterations "
            f"{prev[0][0]}-{prev[-1][0]}",
            {"metric": key, "iterations": [h.iteration], "values": [cur], "median": base,
             "ratio": ratio, "history_iterations": iterations(prev)},
            "Look at this iteration's batch (an outlier or corrupt example?) and the gradient norm; "
            "if it repeats, lower the learning rate" + lr_hint(h) + " and keep gradient clipping on.",
            score=ratio / t.loss_spike_warn, key=key,
        )
    return out
