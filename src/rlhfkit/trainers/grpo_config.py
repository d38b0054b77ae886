"""GRPOConfig and its presets: every option of `rlhfkit grpo`, `rloo`, `gspo`, `dapo` and
`reinforce_pp` (this text is --help). The presets only change defaults: `rlhfkit gspo` is
`rlhfkit grpo importance_level=sequence clip_eps=3e-4 ...`, see each class.

Defaults demonstrate GRPO offline on CPU: SmolLM2-135M-Instruct with LoRA on the built-in
arithmetic problems, exact-match reward, held-out accuracy printed before and after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlhfkit.core.choices import (
    ADVANTAGES,
    GROUPLESS_ADVANTAGES,
    IMPORTANCE_LEVELS,
    LOSS_AGGREGATIONS,
    ON_POLICY_BACKENDS,
    REINFORCE_PP_ADVANTAGES,
    REWARD_SCALINGS,
)
from rlhfkit.core.config import check, option, retune
from rlhfkit.runtime.batch_plan import check_micro_batch_size
from rlhfkit.trainers.options import (
    GENERATION_BATCH_HELP,
    BetaArgs,
    ClippedRatioArgs,
    GenerationArgs,
    ModelArgs,
    OptimizerArgs,
    PolicyGradientArgs,
    ReferenceArgs,
    RolloutArgs,
    RunArgs,
    SamplingArgs,
    SharePromptsArgs,
    TeacherArgs,
)
from rlhfkit.trainers.reward_options import (
    REWARD_SPECS_HELP,
    AgentArgs,
    CodeRewardArgs,
    EnvArgs,
    RemoteRewardArgs,
)

GROUPLESS = GROUPLESS_ADVANTAGES  # advantages that need no group of G >= 2 samples
REINFORCE_PP = REINFORCE_PP_ADVANTAGES
OFF_POLICY_TIS_CAP = 2.0  # one_step_off_policy's cap when tis_cap is unset (Yao et al. 2025 use C = 2)


@dataclass
class GRPOConfig(AgentArgs, TeacherArgs, CodeRewardArgs, SharePromptsArgs, BetaArgs, ClippedRatioArgs,
                 PolicyGradientArgs, RolloutArgs, EnvArgs, RemoteRewardArgs, GenerationArgs, ReferenceArgs,
                 SamplingArgs, ModelArgs, OptimizerArgs, RunArgs):
    """GRPO: G sampled completions per prompt, group-relative advantages, clipped ratio, no value head."""

    # data and reward
    prompts = retune("builtin:arithmetic", "prompts: builtin:arithmetic|reviews|stories|instructions|python-tasks or a "
                     "JSONL/CSV/TXT file")
    num_eval_prompts = retune(100, "held-out prompts sampled (at `temperature`) before and after training (0 = skip)")
    reward = retune("arithmetic", "arithmetic (exact match) | sentiment | " + REWARD_SPECS_HELP)
    solved_threshold: float = option(1.0, "a sample counts as solved when its score is >= this (rollout/solved_fraction)")
    # rollout
    iterations = retune(30)
    rollout_batch_size = retune(64, "completions sampled per iteration and process = prompts per iteration x "
                                "group_size (N processes: N x this; mini/micro batch sizes are per process)")
    group_size: int = option(8, "G: completions sampled per prompt (the group the baseline is taken over)")
    max_new_tokens = retune(16, "response length limit")
    prompts_per_generate = retune(64, GENERATION_BATCH_HELP)
    share_prompts = retune(True, "run each prompt once per generate() call and per micro-batch instead of once "
                                 "per completion (its keys/values are copied to the G rows; equal up to float "
                                 "rounding); a mini-batch's rows are ordered by group so its micro-batches hold "
                                 "few distinct prompts; a header all prompts share (a long system prompt) runs once per "
                                 "micro-batch. Off under gradient_checkpointing")
    # advantages
    advantage: str = option("group", "baseline: group = GRPO mean (optionally / std); rloo = leave-one-out mean; "
                            "reinforce++ = token returns (score - reward_kl_coef x k1 KL) normalised over the "
                            "batch; reinforce++-baseline = the same after subtracting the group mean score; "
                            "remax = score minus the score of the prompt's greedy completion", ADVANTAGES)
    scale_rewards: str = option("group", "GRPO (advantage=group): divide the centred rewards by the group's std "
                                "(group), by the std of all the rollout's rewards (batch), or not (none = Dr. "
                                "GRPO, centred only); TRL's values. true/false mean group/none",
                                REWARD_SCALINGS)
    drop_zero_std_groups: bool = option(True, "leave groups whose completions all got the same reward (advantage 0: "
                                        "no policy gradient, only compute) out of the teacher-forced pass and the "
                                        "update; the loss is then normalised over the remaining tokens (with "
                                        "beta > 0 their KL term is skipped too; single process only; off with distill_coef > 0, whose "
                                        "term has a signal in every group)")
    score_clip = retune(None, "clip sequence scores to [-c, c] before the advantages")
    reward_kl_coef: float = option(0.0, "reinforce++: coefficient of the per-token k1 KL to the reference in the "
                                   "reward (a reference is then built); other advantages put the KL in the loss (beta)")
    dynamic_sampling: bool = option(False, "DAPO dynamic sampling: draw further rounds of prompts until the batch "
                                    "holds prompts_per_iteration groups whose rewards are not all equal (counted on "
                                    "every process), at most max_sampling_rounds; extra groups are dropped")
    max_sampling_rounds: int = option(3, "dynamic_sampling: most rounds of rollout_batch_size samples per iteration "
                                      "(rollout/sampling_rounds and rollout/extra_samples log the cost)")
    overlong_buffer: int = option(0, "DAPO soft overlong punishment: responses longer than max_new_tokens minus this "
                                  "many tokens lose up to overlong_penalty reward, linearly (0 = off)")
    overlong_penalty: float = option(1.0, "largest overlong punishment (at max_new_tokens tokens)")
    overlong_filter: bool = option(False, "DAPO overlong filtering: responses cut at max_new_tokens (no stop token) "
                                   "count in their group's baseline but not in the loss")
    # update
    update_epochs: int = option(2, "passes over each rollout (GRPO's mu; 1 = on-policy, the ratio stays 1)")
    mini_batch_size: int | None = option(32, "sequences per optimiser step (None = the whole rollout)")
    micro_batch_size = retune(16, "sequences per forward/backward (gradient accumulation = mini / micro); "
                                         "auto: on the CPU 16, on a CUDA GPU the largest power of two dividing the "
                                         "mini-batch, at least 16, whose update fits the free memory by the memory "
                                         "estimate (runtime/batch_plan.py)")
    lr = retune(3e-4, "AdamW learning rate (LoRA default; use ~1e-6..1e-5 for full fine-tuning)")
    clip_eps = retune(0.2, "ratio clip range")
    clip_eps_high: float | None = option(None, "upper clip range (DAPO clip-higher; None = clip_eps)")
    loss_agg: str = option("token-mean", "loss aggregation over a mini-batch (docs/algorithms.md): token-mean = every "
                           "token weighs the same; seq-mean = every sequence (original GRPO); constant = sum / "
                           "loss_agg_constant (Dr. GRPO)", LOSS_AGGREGATIONS)
    loss_agg_constant: float | None = option(None, "divisor of loss_agg=constant (None: mini_batch_size x max_new_tokens "
                                             "x processes)")
    beta = retune(0.0, "coefficient of the KL(pi || pi_ref) term in the loss (kl_loss_estimator); 0 loads no "
                         "reference at all")
    kl_loss_estimator = retune("k3", "KL estimate in the beta term: k3 (DeepSeekMath's; its gradient is that of "
                               "KL(pi_ref || pi)) or k2 (the gradient of KL(pi || pi_ref) itself, on-policy; "
                               "docs/learn/14-the-update.md, entry 17)")
    importance_level: str = option("token", "importance ratio and clip: token = per token (PPO/GRPO); sequence = GSPO's "
                                   "length-normalised sequence ratio, whole sequences clipped; sequence-token = "
                                   "GSPO-token (the sequence ratio's value, each token's gradient)", IMPORTANCE_LEVELS)
    tis_cap: float | None = option(None, "truncated importance sampling: weight each token's loss by min(pi_train / "
                                   "pi_sampler, tis_cap) when the sampler reports its own log-probs (vLLM); HF "
                                   "sampling is the trainer itself, so the weight is exactly 1 (None = off; "
                                   f"{OFF_POLICY_TIS_CAP:g} with one_step_off_policy)")
    one_step_off_policy: bool = option(False, "sample batch n+1 in a background thread, with a copy of the policy "
                                       "as it was before update n, while update n runs: iteration n trains on a "
                                       "batch one update stale, weighted by min(pi_train / pi_sampler, tis_cap) "
                                       f"(tis_cap None becomes {OFF_POLICY_TIS_CAP:g}). Pays where sampling and "
                                       "the update can run at once (a GPU with spare capacity); on a few CPU cores "
                                       "they share the cores. The first iteration, and the first after a resume, "
                                       "sample on-policy. LoRA copies only the adapters; full fine-tuning a whole "
                                       "model. Not with dynamic_sampling, env, generation_backend=vllm, top_k/top_p "
                                       "or FSDP/DeepSpeed")
    # distillation term
    teacher = retune("", "a teacher (causal-LM folder or Hub id sharing the policy's tokenizer) whose per-token "
                     "reverse KL on the sampled tokens is added to the loss with distill_coef (rlhfkit distill's "
                     "loss=reverse-kl; docs/algorithms.md); \"\" = none")
    distill_coef: float = option(0.0, "coefficient of the distillation term: loss = GRPO's loss + distill_coef x the "
                                 "token mean of (log pi - log p_teacher) x ratio on the sampled tokens, logged apart "
                                 "as loss/distill and distill/reverse_kl (0 = off, no teacher loaded)")
    # outputs and checks
    ratio_check_tol = retune(1e-3, "max |ratio-1| allowed on the first micro-batch of each rollout (it repeats "
                             "the scoring pass exactly, so anything above float noise means broken log-probs)")

    # what trainers/rl.py reads (its RLConfig) that GRPO has no option for
    eval_samples_per_prompt: ClassVar[int] = 1
    trunk_cache_mb: ClassVar[float] = 0.0

    @property
    def optimiser_steps_per_iteration(self) -> int:
        return self.update_epochs * max(1, self.rollout_batch_size // self.optimiser_batch)

    @property
    def prompts_per_iteration(self) -> int:
        return self.rollout_batch_size // self.group_size

    @property
    def optimiser_batch(self) -> int:
        return self.mini_batch_size or self.rollout_batch_size

    def validate(self) -> None:
        check(self.iterations >= 1, f"iterations ({self.iterations}) must be >= 1")
        for k in ("rollout_batch_size", "update_epochs", "max_new_tokens", "prompts_per_generate"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check_micro_batch_size(self.micro_batch_size)
        check(self.group_size >= 2 or self.advantage in GROUPLESS,
              f"group_size ({self.group_size}) must be >= 2: a group of one has no baseline")
        check(self.group_size >= 1, f"group_size ({self.group_size}) must be >= 1")
        check(self.rollout_batch_size % self.group_size == 0,
              f"rollout_batch_size ({self.rollout_batch_size}) must be divisible by group_size ({self.group_size})")
        mini = self.optimiser_batch
        check(mini >= 1, f"mini_batch_size ({self.mini_batch_size}) must be >= 1")
        check(self.rollout_batch_size % mini == 0,
              f"rollout_batch_size ({self.rollout_batch_size}) must be divisible by mini_batch_size ({mini})")
        check(self.micro_batch_size == "auto" or mini % self.micro_batch_size == 0,
              f"mini_batch_size ({mini}) must be divisible by micro_batch_size ({self.micro_batch_size})")
        check(self.temperature > 0, f"temperature ({self.temperature}) must be > 0 for sampled rollouts")
        check(0 < self.top_p <= 1, f"top_p ({self.top_p}) must be in (0, 1]")
        check(self.log_samples >= 0, f"log_samples ({self.log_samples}) must be >= 0")
        check(self.ratio_check_tol > 0, f"ratio_check_tol ({self.ratio_check_tol}) must be > 0")
        check(self.score_clip is None or self.score_clip > 0, f"score_clip ({self.score_clip}) must be > 0 or None")
        check(self.clip_eps > 0, f"clip_eps ({self.clip_eps}) must be > 0")
        check(self.clip_eps_high is None or self.clip_eps_high > 0, f"clip_eps_high ({self.clip_eps_high}) must be > 0")
        check(self.beta >= 0, f"beta ({self.beta}) must be >= 0")
        check(self.loss_agg_constant is None or self.loss_agg_constant > 0,
              f"loss_agg_constant ({self.loss_agg_constant}) must be > 0")
        check(self.num_eval_prompts >= 0, f"num_eval_prompts ({self.num_eval_prompts}) must be >= 0")
        check(self.distill_coef >= 0, f"distill_coef ({self.distill_coef}) must be >= 0")
        check(self.distill_coef == 0 or bool(self.teacher),
              f"distill_coef ({self.distill_coef}) needs a teacher: teacher=MODEL")
        check(not self.teacher or self.distill_coef > 0,
              f"teacher ({self.teacher}) is used only with distill_coef > 0 (e.g. distill_coef=0.1)")
        self.validate_variants()

    def validate_variants(self) -> None:
        """The options of GSPO, DAPO, REINFORCE++ and the importance-sampling correction."""
        check(self.reward_kl_coef >= 0, f"reward_kl_coef ({self.reward_kl_coef}) must be >= 0")
        check(self.reward_kl_coef == 0 or self.advantage in REINFORCE_PP,
              f"reward_kl_coef ({self.reward_kl_coef}) applies to advantage=reinforce++ or reinforce++-baseline; "
              f"with advantage={self.advantage} put the KL in the loss (beta)")
        check(self.max_sampling_rounds >= 1, f"max_sampling_rounds ({self.max_sampling_rounds}) must be >= 1")
        check(not self.dynamic_sampling or self.group_size >= 2,
              f"dynamic_sampling keeps groups with a reward spread: group_size ({self.group_size}) must be >= 2")
        check(0 <= self.overlong_buffer <= self.max_new_tokens,
              f"overlong_buffer ({self.overlong_buffer}) must be in [0, max_new_tokens={self.max_new_tokens}]")
        check(self.overlong_penalty >= 0, f"overlong_penalty ({self.overlong_penalty}) must be >= 0")
        check(self.tis_cap is None or self.tis_cap >= 1, f"tis_cap ({self.tis_cap}) must be >= 1 or None")
        if self.one_step_off_policy:
            self.validate_off_policy()
        if self.agent:
            self.validate_agent()

    def validate_agent(self) -> None:
        """What agent episodes (rows per episode vary, the baseline is taken over episodes) refuse."""
        check(not self.env, f"agent and env ({self.env}) are two rollout sources: give one")
        check(self.advantage in ("group", "rloo"), f"agent: advantage must be group or rloo (got {self.advantage})")
        check(not self.dynamic_sampling and not self.one_step_off_policy,
              "agent: dynamic_sampling and one_step_off_policy are not supported with agent episodes")

    def validate_off_policy(self) -> None:
        """The combinations one_step_off_policy refuses (its default truncation cap: `derived`)."""
        refused = [("dynamic_sampling=true", self.dynamic_sampling), (f"env={self.env}", bool(self.env)),
                   (f"generation_backend={self.generation_backend}", self.generation_backend not in ON_POLICY_BACKENDS),
                   (f"top_k={self.top_k}", self.top_k not in (0, None)), (f"top_p={self.top_p}", self.top_p < 1)]
        for what, bad in refused:
            check(not bad, f"one_step_off_policy: not supported with {what} (the sampler thread draws full-"
                  "vocabulary single-turn batches of one round with HF generate or the lean loop)")

    def derived(self) -> dict:
        """one_step_off_policy's stale batches need the truncation cap: tis_cap None becomes OFF_POLICY_TIS_CAP."""
        return {"tis_cap": OFF_POLICY_TIS_CAP} if self.one_step_off_policy and self.tis_cap is None else {}

    @property
    def uses_reference(self) -> bool:
        """A reference model is built: for the KL term in the loss or in the reward."""
        return self.beta > 0 or self.reward_kl_coef > 0


@dataclass
class RLOOConfig(GRPOConfig):
    """RLOO: REINFORCE with the leave-one-out baseline over G completions per prompt (Ahmadian et al. 2024)."""

    advantage = retune("rloo", "baseline: rloo = mean of the other G-1 scores; group = GRPO's group mean")
    update_epochs = retune(1, "passes over each rollout (1 = REINFORCE: on-policy, the ratio is exactly 1)")
    mini_batch_size = retune(None, "sequences per optimiser step (None = the whole rollout: one step)")


@dataclass
class GSPOConfig(GRPOConfig):
    """GSPO: GRPO with the length-normalised sequence importance ratio, whole sequences clipped (Zheng et al. 2025)."""

    command: ClassVar[str] = "gspo"
    importance_level = retune("sequence", "importance ratio and clip: sequence = GSPO; sequence-token = "
                              "GSPO-token; token = GRPO's per-token ratio")
    clip_eps = retune(3e-4, "lower clip range of the sequence ratio (GSPO's 3e-4: sequence ratios stay "
                      "near 1, so the range is two orders below GRPO's)")
    clip_eps_high = retune(4e-4, "upper clip range of the sequence ratio (GSPO's 4e-4)")
    loss_agg = retune("seq-mean", "loss aggregation: seq-mean = GSPO's mean over sequences; token-mean; constant")


@dataclass
class DAPOConfig(GRPOConfig):
    """DAPO: clip-higher, dynamic sampling, token-level loss and overlong reward shaping (Yu et al. 2025)."""

    command: ClassVar[str] = "dapo"
    clip_eps_high = retune(0.28, "upper clip range (DAPO clip-higher: 0.28 against the lower 0.2)")
    dynamic_sampling = retune(True, "draw further rounds until the batch holds prompts_per_iteration groups "
                              "whose rewards are not all equal, at most max_sampling_rounds")
    overlong_buffer = retune(4, "soft overlong punishment over the last N tokens before max_new_tokens (here a "
                                  "quarter of the limit; DAPO used 4096 of 20480; 0 = off)")


@dataclass
class ReinforcePPConfig(GRPOConfig):
    """REINFORCE++: token returns with a per-token KL penalty, normalised over the global batch (Hu 2025)."""

    command: ClassVar[str] = "reinforce_pp"
    advantage = retune("reinforce++", "reinforce++ = no baseline, one sample per prompt; reinforce++-baseline "
                       "= the group mean score subtracted first (group_size >= 2)")
    group_size = retune(1, "completions per prompt (1: REINFORCE++; >= 2 for reinforce++-baseline)")
    reward_kl_coef = retune(0.01, "coefficient of the per-token k1 KL to the reference in the reward")
