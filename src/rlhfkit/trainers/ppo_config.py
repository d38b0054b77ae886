"""PPOConfig: every option of `rlhfkit ppo`, documented once (this text is --help)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.core.choices import KL_ESTIMATORS, KL_PENALTY_PLACES, PPO_LOSS_AGGREGATIONS
from rlhfkit.core.config import check, option, retune
from rlhfkit.runtime.batch_plan import check_micro_batch_size
from rlhfkit.trainers.options import (
    GENERATION_BATCH_HELP,
    ClippedRatioArgs,
    GenerationArgs,
    ModelArgs,
    OptimizerArgs,
    PolicyGradientArgs,
    ReferenceArgs,
    RolloutArgs,
    RunArgs,
    SamplingArgs,
)
from rlhfkit.trainers.reward_options import AgentArgs, CodeRewardArgs, EnvArgs, RemoteRewardArgs


@dataclass
class ActorCriticArgs(CodeRewardArgs, PolicyGradientArgs, RolloutArgs, EnvArgs, RemoteRewardArgs, GenerationArgs, ReferenceArgs,
                      SamplingArgs, ModelArgs, OptimizerArgs, RunArgs):
    """What the actor-critic trainers (PPO, TRPO) share: the rollout, the KL-shaped rewards, GAE and the critic."""

    # The CPU demo adapts the top 12 of SmolLM2's 30 layers: backward stops there (docs/benchmarks.md, "Frozen
    # trunk") and sentiment is still learned. Set lora_layers=None for every layer.
    lora_layers = retune(12, "adapt only the top N transformer layers (None: all); backward stops below them")

    share_prefix: bool = option(True, "run the prompt prefix that every row of a batch shares (a chat template's "
                                "header) once per generate() call and per micro-batch; equal up to float rounding "
                                "(figures: docs/benchmarks.md). Off under gradient_checkpointing")

    # data and reward (prompts, eval_prompts, reward, reward_weights: RolloutArgs, PolicyGradientArgs)
    num_eval_prompts = retune(64, "held-out prompts sampled before and after training (0 = skip)")
    eval_samples_per_prompt = retune(3, "completions per held-out prompt, before and after (the same random "
                                     "draws both times)")
    # rollout
    max_new_tokens = retune(48, "response length limit")
    prompts_per_generate = retune(16, GENERATION_BATCH_HELP)
    # update (the critic's optimiser: lr, warmup_steps, ...)
    lr = retune(1e-3, "AdamW learning rate (LoRA default; use ~1e-5 for full fine-tuning)")
    value_clip_eps: float | None = option(0.2, "value clip range around the rollout values (None disables)")
    # advantages and rewards
    gamma: float = option(1.0, "discount")
    # lam=1: the score sits on the last token only, and the critic starts at zero, so with lam=0.95 the first
    # token of a 48-token response would see 0.95^47 = 9% of it. Demo, same seed: +0.20 (0.95) -> +0.39 (1.0).
    lam: float = option(1.0, "GAE lambda (1.0: every token sees the whole sequence score; lower trades bias for "
                        "variance once the critic has learned)")
    whiten_advantages: bool = option(True, "normalise advantages over the rollout batch (after returns are formed)")
    # 0.06: the demo's policy stays under the doctor's KL budget of 10 nats (docs/learn/21-defaults-and-beyond.md has
    # the runs: 0.03 went to 11-16 nats at its end, 0.05 touched 10.6 at one seed, 0.07 stayed at 4-5).
    kl_coef: float = option(0.06, "KL penalty coefficient beta (initial value when adaptive)")
    kl_estimator: str = option("k1", "per-token KL estimator in the reward", KL_ESTIMATORS)
    adaptive_kl: bool = option(False, "adapt beta towards kl_target (Ziegler et al. 2019)")
    kl_target: float = option(6.0, "target per-sequence KL for the adaptive controller")
    kl_horizon: int = option(10000, "horizon of the adaptive controller")
    value_head_lr: float | None = option(None, "learning rate of the value head (the linear map from the last hidden "
                                         "state to V); None: lr. Adam moves each of its weights by about lr per step "
                                         "whatever vf_coef is, so this, not vf_coef, sets how fast the values move")
    # model extras
    critic_model: str | None = option(None, "separate critic backbone (a model folder or Hub id org/name[@revision]); "
                                                 "None = value head on the shared base")

    @property
    def optimiser_steps_per_iteration(self) -> int:
        """TRPO: one natural-gradient step per rollout (PPOConfig: epochs x mini-batches)."""
        return 1

    def validate(self) -> None:
        check(self.iterations >= 1, f"iterations ({self.iterations}) must be >= 1")
        for k in ("rollout_batch_size", "max_new_tokens", "prompts_per_generate", "kl_horizon",
                  "eval_samples_per_prompt"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check_micro_batch_size(self.micro_batch_size)
        check(self.temperature > 0, f"temperature ({self.temperature}) must be > 0 for sampled rollouts")
        check(0 < self.top_p <= 1, f"top_p ({self.top_p}) must be in (0, 1]")
        check(0 <= self.gamma <= 1, f"gamma ({self.gamma}) must be in [0, 1]")
        check(0 <= self.lam <= 1, f"lam ({self.lam}) must be in [0, 1]")
        for k in ("value_clip_eps", "score_clip"):
            check(getattr(self, k) is None or getattr(self, k) > 0, f"{k} ({getattr(self, k)}) must be > 0 or None")
        for k in ("kl_coef", "log_samples", "trunk_cache_mb"):
            check(getattr(self, k) >= 0, f"{k} ({getattr(self, k)}) must be >= 0")
        check(self.value_head_lr is None or self.value_head_lr > 0, f"value_head_lr ({self.value_head_lr}) must be > 0")
        check(self.kl_target > 0, f"kl_target ({self.kl_target}) must be > 0")
        check(self.ratio_check_tol > 0, f"ratio_check_tol ({self.ratio_check_tol}) must be > 0")
        check(self.num_eval_prompts >= 0, f"num_eval_prompts ({self.num_eval_prompts}) must be >= 0")


@dataclass
class PPOConfig(AgentArgs, ClippedRatioArgs, ActorCriticArgs):
    """PPO with GAE and a value head on the shared base (actor-critic), KL penalty against a frozen reference."""

    @property
    def optimiser_steps_per_iteration(self) -> int:
        return self.ppo_epochs * max(1, self.rollout_batch_size // self.mini_batch_size)


    # 1e-4: at lr 1e-3 the zero-initialised head's 576 weights each moved ~1e-3 per Adam step and its values
    # jumped between rollouts (the demo's explained variance -0.1 to -0.8 at every vf_coef tried, 0.1-1.0).
    value_head_lr = retune(1e-4)
    ppo_epochs: int = option(2, "passes over each rollout")
    mini_batch_size: int = option(8, "sequences per optimiser step (gradient accumulation = mini / micro)")
    vf_coef: float = option(0.1, "value-loss coefficient")
    ent_coef: float = option(0.0, "entropy-bonus coefficient")
    loss_agg: str = option("token-mean", "loss aggregation over a mini-batch", PPO_LOSS_AGGREGATIONS)
    kl_penalty: str = option("reward", "fold -beta*KL into the rewards, or add beta * kl_loss_estimator to the loss",
                             KL_PENALTY_PLACES)

    def validate(self) -> None:
        check(not (self.agent and self.env), f"agent and env ({self.env}) are two rollout sources: give one")
        for k in ("mini_batch_size", "ppo_epochs"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.rollout_batch_size % self.mini_batch_size == 0,
              f"rollout_batch_size ({self.rollout_batch_size}) must be divisible by mini_batch_size ({self.mini_batch_size})")
        check(self.micro_batch_size == "auto" or self.mini_batch_size % self.micro_batch_size == 0,
              f"mini_batch_size ({self.mini_batch_size}) must be divisible by micro_batch_size ({self.micro_batch_size})")
        check(self.clip_eps > 0, f"clip_eps ({self.clip_eps}) must be > 0")
        check(self.vf_coef >= 0, f"vf_coef ({self.vf_coef}) must be >= 0")
