"""KTOConfig: every option of `rlhfkit kto`, documented once (this text is --help).

Defaults demonstrate KTO offline on CPU like `rlhfkit dpo`: SmolLM2-135M-Instruct with LoRA on the
built-in review preference file, each pair split into a desirable (chosen) and an undesirable
(rejected) example, then the judged win rate of the trained model over the starting model.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.core.config import check, option, retune
from rlhfkit.trainers.options import (
    BetaArgs,
    DataArgs,
    EvalDataArgs,
    EvalSplitArgs,
    JudgedEvalArgs,
    ModelArgs,
    OfflineArgs,
    OptimizerArgs,
    PairArgs,
    ReferenceArgs,
    RunArgs,
    SharePromptsArgs,
)


@dataclass
class KTOConfig(SharePromptsArgs, BetaArgs, EvalSplitArgs, EvalDataArgs, DataArgs, OfflineArgs, PairArgs, JudgedEvalArgs, ReferenceArgs,
                ModelArgs, OptimizerArgs, RunArgs):
    """KTO: desirable and undesirable completions, no pairs needed, against a frozen reference."""

    eval_data = retune(None, "held-out examples given apart (TRL's eval_dataset; default: the records of the training "
                       "data whose split is eval_split, else none)")

    # data
    data = retune("builtin:prefs_reviews", "examples: a JSONL/CSV with prompt, completion and label (true = "
                       "desirable), or preference pairs (prompt, chosen, rejected: each pair gives one desirable and "
                       "one undesirable example), or builtin:prefs_reviews. Records whose split is eval_split are held "
                       "out")
    max_response_length = retune(128, "completion tokens kept (the start of longer ones, end-of-turn included)")
    # loss
    desirable_weight: float = option(1.0, "lambda_D, the weight of desirable examples (KTO: keep lambda_D n_D / "
                                     "(lambda_U n_U) in [1, 4/3])")
    undesirable_weight: float = option(1.0, "lambda_U, the weight of undesirable examples")
    # reference
    precompute_ref_logps = retune(None, "compute the reference log-probs of every example (and its "
                                               "mismatched row) once before training (None: when the run sees every "
                                               "example at least once, i.e. when it is cheaper)")
    # optimisation
    epochs = retune(2, "passes over the training examples")
    batch_size = retune(32, "examples per optimiser step (all processes together; each takes its share); "
                             "the KL reference point z_0 is estimated over them")
    micro_batch_size = retune(16, "examples per forward/backward")
    share_prompts = retune(True, "run a prompt shared by rows of a micro-batch once, and a header "
                                 "those prompts share (a long system prompt) once (off under gradient_checkpointing)")
    lr = retune(1e-4, "AdamW learning rate (LoRA default; use ~5e-7..5e-6 for full fine-tuning)")

    def validate(self) -> None:
        for k in ("epochs", "batch_size", "micro_batch_size", "max_prompt_length", "max_response_length"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.max_steps is None or self.max_steps >= 1, f"max_steps ({self.max_steps}) must be >= 1")
        check(self.batch_size % self.micro_batch_size == 0,
              f"batch_size ({self.batch_size}) must be divisible by micro_batch_size ({self.micro_batch_size})")
        check(self.batch_size >= 2, f"batch_size ({self.batch_size}) must be >= 2: z_0 pairs each example with "
              "another one's completion")
        check(self.beta > 0, f"beta ({self.beta}) must be > 0")
        check(self.desirable_weight > 0, f"desirable_weight ({self.desirable_weight}) must be > 0")
        check(self.undesirable_weight > 0, f"undesirable_weight ({self.undesirable_weight}) must be > 0")
