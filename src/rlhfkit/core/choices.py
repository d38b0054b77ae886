"""The values a named option may take, defined once.

Every trainer config (trainers/*_config.py, trainers/options.py) takes its `choices` from here, and
the registries that dispatch on the same names (algos/registry.py: advantage estimators, KL
estimators, importance levels, loss aggregations; rollout/backends.py: sampling backends) are keyed
by them, so --help, validation and dispatch cannot drift apart (tests/test_choices.py pins the
registries' keys). The order of a tuple is the order --help lists it in. Plain text only: the
configs import this module without torch.
"""

from __future__ import annotations

DTYPES = ("auto", "fp32", "bf16")  # compute dtype; auto resolves to bf16 or fp32 (models/loading.resolve_dtype)
LR_SCHEDULES = ("constant", "linear", "cosine")  # lr after warm-up (runtime/optim.py)
OPTIMIZERS = ("adamw_torch", "adamw_torch_fused", "sgd", "adafactor")  # transformers' `optim` names (runtime/optim.py)
REWARD_SCALINGS = ("group", "batch", "none")  # GRPO's division of the centred rewards by a std (TRL's scale_rewards)
PROMPT_OVERFLOW_MODES = ("truncate_left", "error")  # a prompt longer than max_prompt_length
CODE_REWARDS = ("fraction", "all")  # reward=code's score (rewards/code.py)
CODE_ISOLATIONS = ("auto", "bwrap", "rlimits")  # reward=code's sandbox (rewards/sandbox.py)
GENERATION_BACKENDS = ("hf", "lean", "graph", "vllm")  # who samples rollouts (rollout/backends.py)
ON_POLICY_BACKENDS = ("hf", "lean")  # backends one_step_off_policy's sampler thread runs

# RL: rewards, KL, advantages, the policy loss
KL_ESTIMATORS = ("k1", "k2", "k3", "abs")  # per-token KL in the reward (algos/kl.py)
KL_LOSS_ESTIMATORS = ("k3", "k2")  # KL term in the loss: k3 first, the default
KL_PENALTY_PLACES = ("reward", "loss")  # where PPO puts beta * KL
ADVANTAGES = ("group", "rloo", "reinforce++", "reinforce++-baseline", "remax")  # GRPO family's baselines
GROUPLESS_ADVANTAGES = ("reinforce++", "remax")  # need no group of G >= 2 samples
REINFORCE_PP_ADVANTAGES = ("reinforce++", "reinforce++-baseline")  # computed after the log-prob pass
IMPORTANCE_LEVELS = ("token", "sequence", "sequence-token")  # ratio and clip per token or per sequence (GSPO)
LOSS_AGGREGATIONS = ("token-mean", "seq-mean", "constant")  # algos/losses.aggregate_loss
PPO_LOSS_AGGREGATIONS = LOSS_AGGREGATIONS[:2]  # PPO: no constant divisor
TRPO_FVP_MODES = ("gauss-newton", "double-backward")  # TRPO's Fisher-vector product
DISTILL_LOSSES = ("reverse-kl", "jsd")  # distillation losses (algos/distill.py)
DISTILL_OFF_POLICY_DATA = ("teacher", "dataset")  # where distillation's off-policy sequences come from

# reward models
RM_NORMALIZATIONS = ("none", "center", "standardize")
RM_POOLINGS = ("auto", "last", "mean")
