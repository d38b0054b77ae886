"""DistillConfig: every option of `rlhfkit distill`, documented once (this text is --help).

Defaults demonstrate on-policy distillation offline on CPU: SmolLM2-135M-Instruct with LoRA samples
answers to the built-in arithmetic problems, the teacher (`teacher=`, e.g. the merged weights of an
`rlhfkit grpo` run: RUN/final/merged) scores every sampled token, and the student minimises the
per-token reverse KL to it; held-out accuracy is printed before and after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlhfkit.core.choices import DISTILL_LOSSES, DISTILL_OFF_POLICY_DATA
from rlhfkit.core.config import check, option, retune
from rlhfkit.trainers.options import (
    GenerationArgs,
    ModelArgs,
    OptimizerArgs,
    PolicyGradientArgs,
    RolloutArgs,
    RunArgs,
    SamplingArgs,
    SharePromptsArgs,
    TeacherArgs,
)


@dataclass
class DistillConfig(TeacherArgs, SharePromptsArgs, PolicyGradientArgs, RolloutArgs, GenerationArgs, SamplingArgs,
                    ModelArgs, OptimizerArgs, RunArgs):
    """Distillation: a student learns a teacher's per-token distributions, on its own samples (on-policy) or not."""

    # what trainers/rl.py reads (its RLConfig), or a mixed-in group declares, that distillation has no option for
    env: ClassVar[str] = ""  # single-turn only
    reward_weights: ClassVar[list[float] | None] = None
    trunk_cache_mb: ClassVar[float] = 0.0
    eval_samples_per_prompt: ClassVar[int] = 1
    update_epochs: ClassVar[int] = 1  # one pass: on-policy samples are used once
    score_clip: ClassVar[float | None] = None  # the reward is logged, not trained on
    no_stop_penalty: ClassVar[float | None] = None

    # teacher and loss
    teacher = retune("", "the teacher: a local causal-LM folder (e.g. an `rlhfkit grpo` run's final/merged) or "
                     "a Hub id org/name[@revision]; it must share the student's tokenizer (a different "
                     "vocabulary stops before training). Frozen, in eval mode, in bf16 where dtype resolves to bf16")
    loss: str = option("reverse-kl", "reverse-kl = on-policy distillation: the per-token reverse KL to the teacher "
                       "estimated on the student's own samples (the teacher scores only the sampled tokens; "
                       "lmbda must be 1); jsd = GKD's generalised Jensen-Shannon divergence over whole next-token "
                       "distributions (beta, distill_topk), on a share lmbda of student samples and 1 - lmbda of "
                       "off-policy sequences (off_policy_data). Supervised KD: loss=jsd lmbda=0 beta=0. "
                       "docs/algorithms.md", DISTILL_LOSSES)
    # GKD's JSD mixture weight, not the KL strength of BetaArgs (tests/runtime/test_option_declarations.py)
    beta: float = option(0.5, "jsd: the teacher's share of the mixture m = beta p_teacher + (1 - beta) p_student; "
                         "0 = forward KL(teacher || student), 1 = reverse KL(student || teacher) (GKD's and TRL's "
                         "convention)")
    lmbda: float = option(1.0, "share of iterations whose sequences the student samples (on-policy); the others use "
                          "off_policy_data. Each iteration draws its coin from the seed, as GKD does per batch "
                          "(GKD's default 0.5; 1 = always on-policy)")
    distill_topk: int | None = option(None, "jsd: keep only the teacher's K largest logits per position; both "
                                      "distributions are renormalised over those K tokens (None = the whole vocabulary)")
    off_policy_data: str = option("teacher", "where the off-policy sequences (1 - lmbda) come from: teacher = the "
                                  "teacher samples answers to the prompts; dataset = each prompt record's "
                                  "`completion_field`", DISTILL_OFF_POLICY_DATA)
    completion_field: str = option("answer", "off_policy_data=dataset: the prompt records' field holding the "
                                   "reference completion (builtin:arithmetic: answer)")
    # data and evaluation
    prompts = retune("builtin:arithmetic", "prompts: builtin:arithmetic|reviews|stories|instructions or a "
                     "JSONL/CSV/TXT file")
    num_eval_prompts = retune(100, "held-out prompts sampled (at `temperature`) before and after training (0 = skip)")
    reward = retune("arithmetic", "reward that scores samples for the log and the before/after check (not "
                    "trained on): arithmetic (exact match) | sentiment | length[:N] | model:PATH | "
                    "python:module:function")
    # rollout and update
    iterations = retune(30, "iterations (sample, score with the teacher, update)")
    rollout_batch_size = retune(64, "sequences per iteration and process, one per prompt")
    max_new_tokens = retune(16, "response length limit (student and teacher samples)")
    prompts_per_generate = retune(64, "prompts per generate() call on the CPU; on a CUDA GPU at least this "
                                   "many, all of them where free GPU memory holds their KV cache")
    share_prompts = retune(True, "run a prompt several rows share once per micro-batch (off under "
                           "gradient_checkpointing)")
    mini_batch_size: int | None = option(32, "sequences per optimiser step (None = the whole rollout)")
    micro_batch_size: int = option(16, "sequences per forward/backward (gradient accumulation = mini / micro)")
    lr = retune(3e-4, "AdamW learning rate (LoRA default; use ~1e-6..1e-5 for full fine-tuning)")
    ratio_check_tol = retune(1e-3, "max |ratio-1| allowed on the first micro-batch of each rollout (it "
                             "repeats the scoring pass, so more than float noise means broken log-probs)")

    @property
    def optimiser_batch(self) -> int:
        return self.mini_batch_size or self.rollout_batch_size

    @property
    def optimiser_steps_per_iteration(self) -> int:
        return max(1, self.rollout_batch_size // self.optimiser_batch)

    def validate(self) -> None:
        check(bool(self.teacher), "teacher is required: teacher=MODEL (a causal-LM folder or Hub id sharing the "
              "student's tokenizer)")
        for k in ("iterations", "rollout_batch_size", "max_new_tokens", "prompts_per_generate", "micro_batch_size"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(0 <= self.beta <= 1, f"beta ({self.beta}) must be in [0, 1]")
        check(0 <= self.lmbda <= 1, f"lmbda ({self.lmbda}) must be in [0, 1]")
        check(self.distill_topk is None or self.distill_topk >= 1,
              f"distill_topk ({self.distill_topk}) must be >= 1 or None")
        check(self.loss == "jsd" or self.lmbda == 1,
              f"lmbda ({self.lmbda}) must be 1 with loss=reverse-kl: its estimate needs the student's own samples "
              "(off-policy sequences: loss=jsd)")
        check(self.loss == "jsd" or self.distill_topk is None,
              f"distill_topk ({self.distill_topk}) applies to loss=jsd (reverse-kl reads only the sampled tokens)")
        mini = self.optimiser_batch
        check(mini >= 1, f"mini_batch_size ({self.mini_batch_size}) must be >= 1")
        check(self.rollout_batch_size % mini == 0,
              f"rollout_batch_size ({self.rollout_batch_size}) must be divisible by mini_batch_size ({mini})")
        check(mini % self.micro_batch_size == 0,
              f"mini_batch_size ({mini}) must be divisible by micro_batch_size ({self.micro_batch_size})")
        check(self.temperature > 0, f"temperature ({self.temperature}) must be > 0 for sampled rollouts")
        check(self.ratio_check_tol > 0, f"ratio_check_tol ({self.ratio_check_tol}) must be > 0")
        check(self.num_eval_prompts >= 0, f"num_eval_prompts ({self.num_eval_prompts}) must be >= 0")
        check(self.log_samples >= 0, f"log_samples ({self.log_samples}) must be >= 0")
