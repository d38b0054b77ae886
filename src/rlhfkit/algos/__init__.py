"""rlhfkit.algos: the pure-tensor RL maths core (imports torch only).

Notation used in every docstring: B batch, T response length, V vocab, G group size.

- masks:      masked_sum / masked_mean / masked_var / masked_whiten, explained_variance, response_mask, last_valid_index
- logprobs:   logprobs_from_logits, entropy_from_logits, logprobs_and_entropy (temperature-aware)
- head:       head_logprobs (log-probs and entropy from hidden states, output layer fused in)
- kl:         kl_k1 / kl_k2 / kl_k3 / kl_abs / kl_estimate, Fixed- and AdaptiveKLController
- rewards:    shape_rewards (per-token KL penalty + sequence score on the last valid token)
- advantages: gae (+ gae_reference loop), group_advantages (GRPO), leave_one_out_advantages (RLOO)
- losses:     aggregate_loss (the one aggregation rule), ppo_policy_loss, ppo_value_loss,
              entropy_loss, dpo_loss (sigmoid / cDPO / IPO), bradley_terry_loss
- policy_gradient: clipped_policy_loss (token / GSPO sequence / GSPO-token ratio), truncated_is_weights,
              overlong_penalty (DAPO), reward_to_go (REINFORCE++), remax_advantages
- preference: simpo_loss, orpo_loss, kto_loss, kto_reference_point
- distill:    reverse_kl_loss (on-policy distillation), generalized_jsd / jsd_loss (GKD), teacher_topk,
              topk_logprobs
- trpo:       surrogate_advantage, token_kl, fisher_vector_product, conjugate_gradient, scale_step,
              backtracking_line_search, trpo_step (+ flat-parameter helpers)
"""

from .advantages import (
    discounted_reverse_cumsum,
    gae,
    gae_reference,
    group_advantages,
    leave_one_out_advantages,
)
from .distill import generalized_jsd, jsd_loss, reverse_kl_loss, teacher_topk, topk_logprobs
from .head import head_logprobs
from .kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_abs,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
)
from .logprobs import entropy_from_logits, logprobs_and_entropy, logprobs_from_logits
from .losses import (
    AGG_MODES,
    DPO_LOSS_TYPES,
    aggregate_loss,
    bradley_terry_loss,
    dpo_loss,
    entropy_loss,
    ppo_policy_loss,
    ppo_value_loss,
)
from .masks import (
    explained_variance,
    last_valid_index,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    response_mask,
)
from .policy_gradient import (
    IMPORTANCE_LEVELS,
    clipped_policy_loss,
    overlong_penalty,
    remax_advantages,
    reward_to_go,
    sequence_log_ratio,
    truncated_is_weights,
)
from .preference import kto_loss, kto_reference_point, log1mexp, orpo_loss, simpo_loss
from .rewards import shape_rewards
from .trpo import (
    backtracking_line_search,
    conjugate_gradient,
    fisher_vector_product,
    flat_grad,
    flat_params,
    line_search_evaluator,
    scale_step,
    set_flat_params_,
    summed_flat_grad,
    surrogate_advantage,
    token_kl,
    trpo_step,
)

__all__ = [
    # masks
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "explained_variance",
    "response_mask",
    "last_valid_index",
    # log-probs
    "logprobs_from_logits",
    "entropy_from_logits",
    "logprobs_and_entropy",
    "head_logprobs",
    # KL
    "KL_ESTIMATORS",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_abs",
    "kl_estimate",
    "FixedKLController",
    "AdaptiveKLController",
    # rewards
    "shape_rewards",
    # advantages
    "gae",
    "gae_reference",
    "discounted_reverse_cumsum",
    "group_advantages",
    "leave_one_out_advantages",
    # losses
    "AGG_MODES",
    "DPO_LOSS_TYPES",
    "aggregate_loss",
    "ppo_policy_loss",
    "ppo_value_loss",
    "entropy_loss",
    "dpo_loss",
    "bradley_terry_loss",
    # policy-gradient variants
    "IMPORTANCE_LEVELS",
    "sequence_log_ratio",
    "clipped_policy_loss",
    "truncated_is_weights",
    "overlong_penalty",
    "reward_to_go",
    "remax_advantages",
    # preference losses beside DPO
    "simpo_loss",
    "orpo_loss",
    "kto_loss",
    "kto_reference_point",
    "log1mexp",
    # distillation
    "reverse_kl_loss",
    "generalized_jsd",
    "jsd_loss",
    "teacher_topk",
    "topk_logprobs",
    # TRPO
    "surrogate_advantage",
    "token_kl",
    "fisher_vector_product",
    "conjugate_gradient",
    "scale_step",
    "backtracking_line_search",
    "line_search_evaluator",
    "trpo_step",
    "flat_grad",
    "flat_params",
    "set_flat_params_",
    "summed_flat_grad",
]
