"""DPOConfig: every option of `rlhfkit dpo`, documented once (this text is --help); SimPOConfig and
ORPOConfig are its presets for `rlhfkit simpo` and `rlhfkit orpo` (reference-free losses).

Defaults demonstrate DPO offline on CPU: SmolLM2-135M-Instruct with LoRA on the built-in
preference file (review prompts; chosen = the more positive of the model's own samples), then
the judged win rate of the trained model over the starting model on held-out prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlhfkit.core.config import check, option
from rlhfkit.trainers.options import (
    OVERFLOW_MODES,
    JudgedEvalArgs,
    ModelArgs,
    OptimizerArgs,
    ReferenceArgs,
    RunArgs,
)
from rlhfkit.trainers.pair_losses import LOSS_TYPES, REFERENCE_FREE  # the loss registry's names


@dataclass
class DPOConfig(JudgedEvalArgs, ReferenceArgs, ModelArgs, OptimizerArgs, RunArgs):
    """DPO (sigmoid), IPO and label-smoothed cDPO on preference pairs, against a frozen reference."""

    # data
    prefs: str = option("builtin:prefs_reviews", "preference pairs: a JSONL/CSV from `rlhfkit prefs make` or "
                        "`rlhfkit label export` (prompt, chosen, rejected), or builtin:prefs_reviews. Records with "
                        "split=test are held out")
    max_prompt_length: int = option(192, "prompt tokens kept (the end of longer prompts)")
    prompt_overflow: str = option("truncate_left", "a prompt longer than max_prompt_length: truncate_left keeps its "
                                  "end (one warning says how many were cut); error stops before training",
                                  OVERFLOW_MODES)
    max_response_length: int = option(128, "response tokens kept (the start of longer responses, end-of-turn included)")
    # loss
    loss_type: str = option("sigmoid", "sigmoid = DPO; ipo = IPO on length-averaged log-probs; cdpo = sigmoid with "
                            "label smoothing; simpo = SimPO; orpo = ORPO (both reference-free: no reference is "
                            "built)", LOSS_TYPES)
    beta: float = option(0.1, "inverse temperature of the implicit reward beta * log(pi / pi_ref); simpo: scale of "
                         "the length-normalised reward beta * avg log pi; orpo: weight lambda of the odds-ratio term")
    gamma: float = option(1.0, "simpo: target reward margin gamma (the other losses ignore it)")
    label_smoothing: float | None = option(None, "cDPO: assumed label-flip probability in [0, 0.5) "
                                           "(None: 0.1 for cdpo, 0 for sigmoid; not used by ipo)")
    # reference
    reference_model: str | None = option(None, "reference model: a folder or Hub id org/name[@revision] (None: the "
                                         "adapter-disabled base with LoRA, else a frozen copy of the starting model)")
    precompute_ref_logps: bool | None = option(None, "compute reference log-probs once before training (None: when "
                                               "the run sees every pair at least once, i.e. when it is cheaper)")
    # optimisation
    epochs: int = option(2, "passes over the training pairs")
    max_steps: int | None = option(None, "stop after this many optimiser steps (None: epochs decide)")
    batch_size: int = option(16, "pairs per optimiser step (all processes together; each takes its share)")
    micro_batch_size: int = option(8, "pairs per forward/backward (2 x this many sequences)")
    share_prompts: bool = option(True, "run a pair's prompt once for its chosen and rejected response (their keys/values "
                                 "are copied to both rows; equal up to float rounding), and a header all prompts share (a long system "
                                 "prompt) once per micro-batch. Off under gradient_checkpointing")
    lr: float = option(1e-4, "AdamW learning rate (LoRA default; use ~5e-7..5e-6 for full fine-tuning)")
    # outputs
    save_merged: bool = option(False, "also save merged full weights (LoRA) in final/merged")

    @property
    def uses_reference(self) -> bool:
        return self.loss_type not in REFERENCE_FREE

    @property
    def smoothing(self) -> float:
        if self.label_smoothing is not None:
            return self.label_smoothing
        return 0.1 if self.loss_type == "cdpo" else 0.0

    def validate(self) -> None:
        for k in ("epochs", "batch_size", "micro_batch_size", "max_prompt_length", "max_response_length"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.max_steps is None or self.max_steps >= 1, f"max_steps ({self.max_steps}) must be >= 1")
        check(self.batch_size % self.micro_batch_size == 0,
              f"batch_size ({self.batch_size}) must be divisible by micro_batch_size ({self.micro_batch_size})")
        check(self.beta > 0, f"beta ({self.beta}) must be > 0")
        check(0 <= self.smoothing < 0.5, f"label_smoothing ({self.label_smoothing}) must be in [0, 0.5)")
        check(not (self.loss_type not in ("sigmoid", "cdpo") and self.smoothing > 0),
              f"label_smoothing ({self.label_smoothing}) applies to sigmoid/cdpo, not {self.loss_type}")
        check(self.gamma >= 0, f"gamma ({self.gamma}) must be >= 0")
        check(self.reference_model is None or self.uses_reference,
              f"reference_model is not used by loss_type={self.loss_type} (reference-free)")


@dataclass
class SimPOConfig(DPOConfig):
    """SimPO: reference-free, length-normalised implicit reward with a target margin (Meng et al. 2024)."""

    command: ClassVar[str] = "simpo"
    loss_type: str = option("simpo", "simpo; or any DPO loss (sigmoid, ipo, cdpo, orpo)", LOSS_TYPES)
    beta: float = option(2.0, "scale of the reward beta * avg log pi (SimPO's 2.0-2.5)")
    gamma: float = option(1.0, "target reward margin (gamma / beta = 0.5, inside SimPO's tuned range)")


@dataclass
class ORPOConfig(DPOConfig):
    """ORPO: supervised fine-tuning on the chosen response plus an odds-ratio term, no reference (Hong et al. 2024)."""

    command: ClassVar[str] = "orpo"
    loss_type: str = option("orpo", "orpo; or any DPO loss (sigmoid, ipo, cdpo, simpo)", LOSS_TYPES)
    beta: float = option(0.1, "lambda, the weight of the odds-ratio term against the SFT term (ORPO's 0.1)")
