"""OnlineDPOConfig: every option of `rlhfkit online-dpo`, documented once (this text is --help).

Defaults demonstrate online DPO offline on CPU: SmolLM2-135M-Instruct with LoRA samples two reviews
per built-in review prompt, VADER sentiment judges which is better, one DPO step per batch; then the
judged win rate of the trained model over the starting model on held-out prompts (as `rlhfkit dpo`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlhfkit.core.config import check, option, retune
from rlhfkit.trainers.options import (
    BetaArgs,
    GenerationArgs,
    LabelSmoothingArgs,
    ModelArgs,
    OptimizerArgs,
    ReferenceArgs,
    RolloutArgs,
    RunArgs,
    SamplingArgs,
    SharePromptsArgs,
)
from rlhfkit.trainers.pair_losses import REFERENCE_LOSS_TYPES as LOSS_TYPES  # the loss registry's names


@dataclass
class OnlineDPOConfig(LabelSmoothingArgs, SharePromptsArgs, BetaArgs, RolloutArgs, GenerationArgs, ReferenceArgs,
                      SamplingArgs, ModelArgs, OptimizerArgs, RunArgs):
    """Online DPO: two samples per prompt from the current policy, a judge picks the better, one DPO step."""

    # what trainers/rl.py reads (its RLConfig) that online DPO has no option for
    env: ClassVar[str] = ""  # single-turn only
    reward_weights: ClassVar[list[float] | None] = None  # one judge
    trunk_cache_mb: ClassVar[float] = 0.0
    optimiser_steps_per_iteration: ClassVar[int] = 1  # one DPO step per batch of pairs

    # data and judge
    eval_prompts = retune(None, "held-out prompts for the judged win rate (default: test split of `prompts`)")
    num_eval_prompts = retune(48, "held-out prompts for the judged win rate over the starting model (0 = skip)")
    eval_samples_per_prompt = retune(2, "completions per held-out prompt, before and after training")
    judge: str = option("sentiment", "who prefers one completion: a reward function (sentiment | arithmetic | "
                        "length[:N] | python:module:function) or a reward model (model:PATH); the higher score is "
                        "chosen, equal scores give no pair")
    # rollout
    iterations = retune(16, "iterations (sample pairs, judge, one DPO step)")
    prompts_per_iteration: int = option(16, "prompts per iteration and process, two completions each (N processes: N x "
                                        "this pairs per optimiser step)")
    max_new_tokens = retune(64, "response length limit (training samples and the judged evaluation)")
    prompts_per_generate = retune(32, "completions per generate() call on the CPU; on a CUDA GPU at "
                                        "least this many, all of them where free GPU memory holds their KV "
                                        "cache (rollout/core.py generation_rows)")
    # loss
    loss_type: str = option("sigmoid", "sigmoid = DPO; ipo = IPO on length-averaged log-probs; cdpo = sigmoid with "
                            "label smoothing", LOSS_TYPES)
    micro_batch_size: int = option(8, "pairs per forward/backward")
    lr = retune(1e-4, "AdamW learning rate (LoRA default; use ~5e-7..5e-6 for full fine-tuning)")

    @property
    def reward(self) -> str:
        """The judge, under the name the RL harness (trainers/rl.py) reads."""
        return self.judge

    def validate(self) -> None:
        for k in ("iterations", "prompts_per_iteration", "max_new_tokens", "prompts_per_generate", "micro_batch_size",
                  "eval_samples_per_prompt"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.beta > 0, f"beta ({self.beta}) must be > 0")
        check(0 <= self.smoothing < 0.5, f"label_smoothing ({self.label_smoothing}) must be in [0, 0.5)")
        check(not (self.loss_type not in ("sigmoid", "cdpo", "robust") and self.smoothing > 0),
              f"label_smoothing ({self.label_smoothing}) applies to sigmoid/cdpo/robust, not {self.loss_type}")
        check(self.temperature > 0, f"temperature ({self.temperature}) must be > 0 for sampled pairs")
        check(self.num_eval_prompts >= 0, f"num_eval_prompts ({self.num_eval_prompts}) must be >= 0")
        check(self.log_samples >= 0, f"log_samples ({self.log_samples}) must be >= 0")
