"""KTOConfig: every option of `rlhfkit kto`, documented once (this text is --help).

Defaults demonstrate KTO offline on CPU like `rlhfkit dpo`: SmolLM2-135M-Instruct with LoRA on the
built-in review preference file, each pair split into a desirable (chosen) and an undesirable
(rejected) example, then the judged win rate of the trained model over the starting model.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.core.config import check, option
from rlhfkit.trainers.options import (
    OVERFLOW_MODES,
    JudgedEvalArgs,
    ModelArgs,
    OptimizerArgs,
    ReferenceArgs,
    RunArgs,
)


@dataclass
class KTOConfig(JudgedEvalArgs, ReferenceArgs, ModelArgs, OptimizerArgs, RunArgs):
    """KTO: desirable and undesirable completions, no pairs needed, against a frozen reference."""

    # data
    data: str = option("builtin:prefs_reviews", "examples: a JSONL/CSV with prompt, completion and label (true = "
                       "desirable), or preference pairs (prompt, chosen, rejected: each pair gives one desirable and "
                       "one undesirable example), or builtin:prefs_reviews. Records with split=test are held out")
    max_prompt_length: int = option(192, "prompt tokens kept (the end of longer prompts)")
    prompt_overflow: str = option("truncate_left", "a prompt longer than max_prompt_length: truncate_left keeps its "
                                  "end (one warning says how many were cut); error stops before training",
                                  OVERFLOW_MODES)
    max_response_length: int = option(128, "completion tokens kept (the start of longer ones, end-of-turn included)")
    # loss
    beta: float = option(0.1, "inverse temperature of the implicit reward beta * log(pi / pi_ref)")
    desirable_weight: float = option(1.0, "lambda_D, the weight of desirable examples (KTO: keep lambda_D n_D / "
                                     "(lambda_U n_U) in [1, 4/3])")
    undesirable_weight: float = option(1.0, "lambda_U, the weight of undesirable examples")
    # reference
    reference_model: str | None = option(None, "reference model: a folder or Hub id org/name[@revision] (None: the "
                                         "adapter-disabled base with LoRA, else a frozen copy of the starting model)")
    precompute_ref_logps: bool | None = option(None, "compute the reference log-probs of every example (and its "
                                               "mismatched row) once before training (None: when the run sees every "
                                               "example at least once, i.e. when it is cheaper)")
    # optimisation
    epochs: int = option(2, "passes over the training examples")
    max_steps: int | None = option(None, "stop after this many optimiser steps (None: epochs decide)")
    batch_size: int = option(32, "examples per optimiser step (all processes together; each takes its share); "
                             "the KL reference point z_0 is estimated over them")
    micro_batch_size: int = option(16, "examples per forward/backward")
    share_prompts: bool = option(True, "run a prompt shared by rows of a micro-batch once, and a header "
                                 "those prompts share (a long system prompt) once (off under gradient_checkpointing)")
    lr: float = option(1e-4, "AdamW learning rate (LoRA default; use ~5e-7..5e-6 for full fine-tuning)")
    # outputs
    save_merged: bool = option(False, "also save merged full weights (LoRA) in final/merged")

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
