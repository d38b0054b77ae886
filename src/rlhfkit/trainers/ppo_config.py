"""PPOConfig: every option of `rlhfkit ppo`, documented once (this text is --help)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.core.choices import KL_ESTIMATORS, KL_LOSS_ESTIMATORS, KL_PENALTY_PLACES, PPO_LOSS_AGGREGATIONS
from rlhfkit.core.config import check, option
from rlhfkit.runtime.batch_plan import check_micro_batch_size
from rlhfkit.trainers.options import (
    REWARD_SPECS_HELP,
    AgentArgs,
    EnvArgs,
    GenerationArgs,
    ModelArgs,
    OptimizerArgs,
    ReferenceArgs,
    RunArgs,
    SamplingArgs,
)


@dataclass
class ActorCriticArgs(EnvArgs, GenerationArgs, ReferenceArgs, SamplingArgs, ModelArgs, OptimizerArgs, RunArgs):
    """What the actor-critic trainers (PPO, TRPO) share: the rollout, the KL-shaped rewards, GAE and the critic."""

    # The CPU demo adapts the top 12 of SmolLM2's 30 layers: backward stops there (docs/benchmarks.md, "Frozen
    # trunk") and sentiment is still learned. Set lora_layers=None for every layer.
    lora_layers: int | None = option(12, "adapt only the top N transformer layers (None: all); backward stops below them")
    trunk_cache_mb: float = option(512.0, "with lora_layers, the layers below the adapted ones run once per rollout: "
                                   "their output (B x L x hidden x 4 bytes) is kept for the update when it fits in "
                                   "this many MB, else recomputed per micro-batch (0: always recompute)")

    share_prefix: bool = option(True, "run the prompt prefix that every row of a batch shares (a chat template's "
                                "header) once per generate() call and per micro-batch; equal up to float rounding "
                                "(figures: docs/benchmarks.md). Off under gradient_checkpointing")

    # data and reward
    prompts: str = option("builtin:reviews", "prompts: builtin:reviews|stories|arithmetic|instructions or a JSONL/CSV/TXT file")
    eval_prompts: str | None = option(None, "held-out prompts for the before/after check (default: test split of `prompts`)")
    num_eval_prompts: int = option(64, "held-out prompts sampled before and after training (0 = skip)")
    eval_samples_per_prompt: int = option(3, "completions per held-out prompt, before and after (the same random "
                                          "draws both times)")
    reward: str = option("sentiment", "sentiment | arithmetic | " + REWARD_SPECS_HELP, several=True)
    reward_weights: list[float] | None = option(None, "one weight per reward in `reward` (None: 1 each)")
    # rollout
    iterations: int = option(18, "iterations (rollout + update)")
    rollout_batch_size: int = option(16, "prompts sampled per iteration, per process (N processes sample N x this "
                                     "different prompts; mini/micro batch sizes are per process too)")
    max_new_tokens: int = option(48, "response length limit")
    generation_batch_size: int = option(16, "prompts per generate() call on the CPU; on a CUDA GPU at "
                                        "least this many, all of them where free GPU memory holds their KV "
                                        "cache (rollout/core.py generation_rows)")
    # update (the critic's optimiser: lr, warmup_steps, ...)
    micro_batch_size: int | str = option(8, "sequences per forward/backward; auto: on the CPU 8, on a CUDA GPU the "
                                         "largest power of two dividing mini_batch_size, at least 8, whose update fits "
                                         "the free memory by the memory estimate (runtime/batch_plan.py)")
    lr: float = option(1e-3, "AdamW learning rate (LoRA default; use ~1e-5 for full fine-tuning)")
    value_clip_eps: float | None = option(0.2, "value clip range around the rollout values (None disables)")
    # advantages and rewards
    gamma: float = option(1.0, "discount")
    # lam=1: the score sits on the last token only, and the critic starts at zero, so with lam=0.95 the first
    # token of a 48-token response would see 0.95^47 = 9% of it. Demo, same seed: +0.20 (0.95) -> +0.39 (1.0).
    lam: float = option(1.0, "GAE lambda (1.0: every token sees the whole sequence score; lower trades bias for "
                        "variance once the critic has learned)")
    whiten_advantages: bool = option(True, "normalise advantages over the rollout batch (after returns are formed)")
    # 0.03: with lam=1 the demo's policy moves 7-13 nats from the reference in 18 iterations (0.05: 5-10 nats and a
    # smaller, less dependable sentiment gain; 0.02: 16-22 nats, past the doctor's KL budget of 10).
    kl_coef: float = option(0.03, "KL penalty coefficient beta (initial value when adaptive)")
    kl_estimator: str = option("k1", "per-token KL estimator in the reward", KL_ESTIMATORS)
    adaptive_kl: bool = option(False, "adapt beta towards kl_target (Ziegler et al. 2019)")
    kl_target: float = option(6.0, "target per-sequence KL for the adaptive controller")
    kl_horizon: int = option(10000, "horizon of the adaptive controller")
    score_clip: float | None = option(None, "clip sequence scores to [-c, c]")
    no_stop_penalty: float | None = option(None, "score given to responses that never emit a stop token (None: keep)")
    # model extras
    critic_model: str | None = option(None, "separate critic backbone (a model folder or Hub id org/name[@revision]); "
                                                 "None = value head on the shared base")
    ratio_check_tol: float = option(1e-3, "max |ratio-1| allowed on the first micro-batch of each rollout; it repeats the "
                                    "scoring pass exactly, so anything above float noise means broken log-probs")
    # outputs
    log_samples: int = option(4, "completions per iteration written to samples.jsonl")
    save_merged: bool = option(False, "also save merged full weights (LoRA) in final/merged")

    @property
    def optimiser_steps_per_iteration(self) -> int:
        """TRPO: one natural-gradient step per rollout (PPOConfig: epochs x mini-batches)."""
        return 1

    def validate(self) -> None:
        check(self.iterations >= 1, f"iterations ({self.iterations}) must be >= 1")
        for k in ("rollout_batch_size", "max_new_tokens", "generation_batch_size", "kl_horizon",
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
        check(self.kl_target > 0, f"kl_target ({self.kl_target}) must be > 0")
        check(self.ratio_check_tol > 0, f"ratio_check_tol ({self.ratio_check_tol}) must be > 0")
        check(self.num_eval_prompts >= 0, f"num_eval_prompts ({self.num_eval_prompts}) must be >= 0")


@dataclass
class PPOConfig(AgentArgs, ActorCriticArgs):
    """PPO with GAE and a value head on the shared base (actor-critic), KL penalty against a frozen reference."""

    @property
    def optimiser_steps_per_iteration(self) -> int:
        return self.ppo_epochs * max(1, self.rollout_batch_size // self.mini_batch_size)


    ppo_epochs: int = option(2, "passes over each rollout")
    mini_batch_size: int = option(8, "sequences per optimiser step (gradient accumulation = mini / micro)")
    clip_eps: float = option(0.2, "PPO ratio clip range")
    vf_coef: float = option(0.1, "value-loss coefficient")
    ent_coef: float = option(0.0, "entropy-bonus coefficient")
    loss_agg: str = option("token-mean", "loss aggregation over a mini-batch", PPO_LOSS_AGGREGATIONS)
    kl_penalty: str = option("reward", "fold -beta*KL into the rewards, or add beta * kl_loss_estimator to the loss",
                             KL_PENALTY_PLACES)
    kl_loss_estimator: str = option("k3", "KL estimate added to the loss with kl_penalty=loss: k3 (GRPO's; its gradient "
                                    "is that of KL(pi_ref || pi)) or k2 (the gradient of KL(pi || pi_ref) itself, "
                                    "on-policy; docs/learn/04-the-update.md, entry 15)", KL_LOSS_ESTIMATORS)

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
