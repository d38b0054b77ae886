"""Every threshold the diagnostic rules use, with the reasoning behind its default.

Override any of them in Python (``Thresholds(clip_frac_warn=0.3)``), from a mapping
(``Thresholds.from_mapping({"clip_frac_warn": 0.3})``, e.g. a YAML file), or on the command
line (``rlhfkit doctor RUN --set clip_frac_warn=0.3``). docs/diagnostics.md explains each rule.

Conventions: "baseline" = mean of the first ``baseline_iterations`` logged values of a metric,
"recent" = mean of the last ``recent_iterations`` values. Averaging a few iterations keeps a
single noisy batch from firing a rule, while still reacting within a few iterations.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from rlhfkit.errors import ConfigError


@dataclass(frozen=True)
class Thresholds:
    """Thresholds of the training-health rules (defaults tuned for LM RLHF runs)."""

    # ---- shared ----------------------------------------------------------------------------
    baseline_iterations: int = 3
    """Values averaged for a metric's starting level (one batch is too noisy)."""
    recent_iterations: int = 3
    """Values averaged for a metric's current level."""
    worsen_margin: float = 0.25
    """The Monitor re-reports a finding of the same severity once its score grew by 25%:
    small wobbles stay quiet, a doubling is news."""
    rearm_after: int = 10
    """A finding that has been silent for this many iterations counts as resolved; if it
    comes back it is reported again."""

    # ---- PPO / GRPO policy update -------------------------------------------------------
    clip_frac_warn: float = 0.2
    """Healthy PPO on LMs clips 1-15% of tokens (0.05 reads as a stable run); above 20%
    (the clip active on one token in five) updates are too big."""
    clip_frac_critical: float = 0.4
    """A clip fraction of 0.6-0.8 is a red flag (most of the gradient is clipped away and what
    remains is noise); 0.4 leaves margin before that."""
    clip_rise_window: int = 8
    """Iterations over which a rising clip fraction is measured."""
    clip_frac_rise: float = 0.15
    """Absolute increase of the clip fraction within the window that counts as "rising"
    (well above batch noise of ~0.02), even while still below clip_frac_warn."""
    approx_kl_warn: float = 0.1
    """params/approx_kl is the per-token KL between the policy before and after one update.
    Healthy runs sit at 0.001-0.05 (the learning path's shipped healthy run: 0.0007-0.010);
    0.05-0.1 is high but can be stable (its 4-epoch run: 0.05-0.07 from iteration 3
    on); 0.1 per token per update is large."""
    approx_kl_critical: float = 0.5
    """Half a nat per token per update: the update left the trust region entirely."""

    # ---- gradients -------------------------------------------------------------------------
    grad_norm_window: int = 20
    """Previous values whose median is the gradient norm's own normal level."""
    grad_norm_min_history: int = 5
    """Previous values needed before comparing against the history at all."""
    grad_norm_spike_warn: float = 5.0
    """Batch-to-batch gradient norms vary by ~2x; 5x the median is a spike."""
    grad_norm_spike_critical: float = 20.0
    """20x the median: an explosion (one step like this can wreck the weights)."""
    grad_norm_clip_warn: float = 10.0
    """Norm (before clipping) over the clip threshold params/max_grad_norm: a norm of 2.9 with
    max 1.0 is stable (clipping exists for that), 17 is a red flag of exploding gradients."""
    grad_norm_clip_critical: float = 100.0
    """Two orders of magnitude past the clip threshold: clipping hides a divergence."""
    default_max_grad_norm: float = 1.0
    """Clip threshold assumed for a history without params/max_grad_norm (another tool's log,
    an older run) and without a max_grad_norm in the run's config.yaml: 1.0 is the usual
    default (rlhfkit, transformers' Trainer, TRL)."""

    # ---- value function --------------------------------------------------------------------
    value_window: int = 10
    """Iterations over which the value loss trend and the movement of the policy and the
    reward are compared (first third vs last third of the window)."""
    value_min_iterations: int = 6
    """A flat value loss is judged from this many iterations on (before value_window is full):
    a critic that stays flat over its first six or seven rollouts while the policy moves is
    already a warning sign. A rise is judged over a full value_window only: early on a
    zero-initialised critic's loss grows with the rewards while it catches up."""
    value_flat_rel: float = 0.1
    """A value loss that fell by less than 10% across the window (first third vs last third)
    counts as flat..."""
    value_flat_band: float = 0.25
    """...when every value of the window also lies within 25% of the window's mean: a loss
    that stays put, not one that bounces (on small batches the loss jumps 2-5x between
    iterations, which says nothing either way)."""
    value_rise_rel: float = 0.5
    """A value loss that rose by 50% across a full window is reported as "rose", a smaller rise
    as "crept up" (both are findings: a learning critic's loss falls while its targets move)."""
    value_reward_move: float = 0.25
    """Rewards "move" when the mean reward changed by at least 0.25 per-sample reward
    standard deviations (rollout/reward_std) across the window: the return targets changed,
    so a learning critic's loss should change too."""
    value_baseline_gap: float = 0.25
    """A critic whose mean value (rollout/value_mean) lies within 0.25 per-sample reward standard
    deviations of the mean return (rollout/return_mean) over the window, with an explained
    variance of about 0 (median not below explained_variance_warn), has learned the returns' mean:
    a flat value loss is then reported as info, not as a critic that does not learn."""
    value_policy_kl: float = 1e-3
    """The policy "moves" when params/approx_kl averages at least 1e-3 nats/token per update
    over the window (~0.05 nats per 48-token response per update; a frozen policy gives
    ~1e-6): the states and return targets change, so a learning critic's loss should too."""
    value_kl_move: float = 1.0
    """The policy also "moves" when its KL to the reference (rollout/kl) changed by at least 1
    nat per sequence across the window."""
    value_learned_frac: float = 0.1
    """A value loss below 10% of the reward variance (reward_std^2) means the critic already
    explains ~90% of the return variance: flat is then fine (a critic's loss should settle at a
    low level)."""
    explained_variance_warn: float = -0.1
    """rollout/explained_variance below -0.1 (the median of the recent iterations, from
    value_min_iterations on): the critic's values predict the returns worse than their mean
    does, by more than the noise of a small batch, so A = R - V varies more than R itself and
    the critic adds noise instead of removing it. A zero-initialised value head reads 0."""
    value_clip_frac_warn: float = 0.5
    """More than half the value predictions clipped: the critic can barely move (value
    targets large compared with the value clip range)."""

    # ---- KL to the reference ---------------------------------------------------------------
    rollout_kl_warn: float = 10.0
    """rollout/kl is the per-sequence k1 KL to the reference in nats. Ziegler et al. (2019)
    target 6 nats with an adaptive controller; past ~10 the reward model is queried far off
    its training distribution and over-optimisation sets in (Gao et al. 2022). Scale it up
    for long responses."""
    rollout_kl_critical: float = 30.0
    """Far past any usual KL budget: the policy has drifted away from the reference."""
    negative_kl_tol: float = 0.05
    """k1 is unbiased, so its batch mean estimates KL >= 0; batch noise can push it slightly
    below 0, but recent values that are all negative with a mean below -0.05 nats mean the
    log-probs of policy and reference are computed inconsistently."""
    negative_kl_critical: float = 0.5
    """Half a nat per sequence below zero is no sampling noise: a log-prob bug."""

    # ---- entropy ---------------------------------------------------------------------------
    entropy_collapse_frac: float = 0.2
    """Recent token entropy below 20% of its starting level: the policy has become nearly
    deterministic and stops exploring (entropy should not collapse early)."""
    entropy_critical_frac: float = 0.05
    """Below 5% of the start: collapsed; further updates only sharpen one answer."""

    # ---- distillation ----------------------------------------------------------------------
    teacher_kl_rise_factor: float = 2.0
    """distill/reverse_kl (or distill/jsd) recently above twice its starting level: distillation
    lowers the divergence to the teacher, so a doubling means the updates push the student away
    (too large a learning rate, or a teacher that does not share the tokenizer or template)."""
    teacher_kl_floor: float = 0.05
    """Nats per token below which a rise is not reported: a student close to its teacher has a
    small, noisy k1 estimate (it can be negative per batch) whose doubling means nothing."""

    # ---- reward ----------------------------------------------------------------------------
    reward_flat_window: int = 25
    """Iterations with no reward movement before "flat" is reported. The reward may not rise for
    the first tens of iterations while the critic warms up, so a flat reward is only info at
    first and becomes a warning when it has not risen above its start after twice this many
    iterations."""
    reward_flat_rel: float = 0.1
    """"Flat" = the mean reward of the window's second half differs from its first half by
    less than 0.1 per-sample reward std (or 10% of |mean| when reward_std is not logged)."""

    # ---- generation ------------------------------------------------------------------------
    length_explode_factor: float = 2.0
    """Recent mean response length at twice its starting level: length hacking (a reward
    that grows with length), or an EOS that is no longer produced."""
    length_collapse_factor: float = 0.5
    """Recent mean response length at half its starting level: answers are being cut short
    (a reward that favours short answers, or EOS too likely)."""
    length_min_tokens: float = 2.0
    """Mean response under 2 tokens: (nearly) empty answers, a critical EOS problem."""
    stop_drop_warn: float = 0.2
    """Absolute fall of the fraction of responses that end with a stop token (vs the start):
    20 points fewer answers finish, they now run into max_new_tokens."""
    stop_drop_critical: float = 0.5
    """Half of all responses lost their stop token."""
    ratio_dev_warn: float = 1e-3
    """max |ratio - 1| on the first micro-batch of a rollout, before any update. It must be 0
    up to float error (~1e-5 in fp32); bf16 logits can reach ~1e-2, hence only a warning."""
    ratio_dev_critical: float = 5e-2
    """5% cannot be float error even in bf16: log-probs are reconstructed wrongly
    (off-by-one slice, dropout on, temperature, position ids: docs/pitfalls.md#off-by-one)."""

    # ---- GRPO --------------------------------------------------------------------------------
    group_std_collapse_frac: float = 0.1
    """Mean within-group reward std below 10% of its start: most groups give identical rewards
    to every completion, so group-relative advantages are ~0 and nothing is learned."""
    solved_window: int = 5
    """Iterations averaged for the solved-fraction rule."""
    solved_high: float = 0.95
    """95% of prompts solved: the task is saturated (info)."""
    solved_low: float = 0.02
    """Under 2% solved: almost no group has a correct completion to learn from."""

    # ---- preference learning (DPO, reward model) ---------------------------------------------
    dpo_logp_drop: float = 5.0
    """Nats per sequence that logps/chosen may fall below its start. DPO only pushes the
    margin; it often lowers the chosen likelihood too ("likelihood displacement",
    Razin et al. 2024; DPOP, Pal et al. 2024). 5 nats = the chosen answer is ~150x less likely."""
    pref_min_iterations: int = 30
    """Iterations before preference accuracy is judged."""
    pref_window: int = 5
    """Iterations averaged for preference accuracy."""
    pref_accuracy_min: float = 0.55
    """Accuracy at or below 55% after pref_min_iterations: no better than chance on pairs."""

    # ---- losses (SFT, DPO, RM, value) ----------------------------------------------------------
    loss_spike_window: int = 10
    """Previous values whose median is a loss's normal level."""
    loss_spike_warn: float = 3.0
    """A loss 3x its recent median: a bad batch or the start of a divergence."""
    loss_spike_critical: float = 10.0
    """10x its recent median: diverging."""
    eval_rise_rel: float = 0.05
    """eval/loss 5% above its best while the training loss keeps falling: overfitting."""

    # ------------------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_mapping(cls, values: dict[str, Any] | None) -> Thresholds:
        """Defaults overridden by ``values``; unknown names or bad values raise ConfigError."""
        return cls().replace(**(values or {}))

    def replace(self, **values: Any) -> Thresholds:
        """A copy with some thresholds changed (validated and converted to the field's type)."""
        types = {f.name: f.type for f in dataclasses.fields(self)}
        clean: dict[str, Any] = {}
        for name, value in values.items():
            if name not in types:
                close = difflib.get_close_matches(name, types, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                raise ConfigError(f"unknown diagnostics threshold '{name}'{hint}")
            kind = int if types[name] in ("int", int) else float
            try:
                number = kind(value)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"diagnostics threshold '{name}' must be a {kind.__name__}, got {value!r}"
                ) from None
            lowest = 1 if kind is int else 0
            if number < lowest:
                raise ConfigError(f"diagnostics threshold '{name}' must be >= {lowest}, got {value!r}")
            clean[name] = number
        return dataclasses.replace(self, **clean)

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)
