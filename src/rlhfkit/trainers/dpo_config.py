"""DPOConfig: every option of `rlhfkit dpo`, documented once (this text is --help); SimPOConfig and
ORPOConfig are its presets for `rlhfkit simpo` and `rlhfkit orpo` (reference-free losses).

Defaults demonstrate DPO offline on CPU: SmolLM2-135M-Instruct with LoRA on the built-in
preference file (review prompts; chosen = the more positive of the model's own samples), then
the judged win rate of the trained model over the starting model on held-out prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlhfkit.core.config import check, option, retune
from rlhfkit.trainers.options import (
    BetaArgs,
    EvalDataArgs,
    EvalSplitArgs,
    JudgedEvalArgs,
    LabelSmoothingArgs,
    ModelArgs,
    OfflineArgs,
    OptimizerArgs,
    PairArgs,
    ReferenceArgs,
    RunArgs,
    SharePromptsArgs,
)
from rlhfkit.trainers.pair_losses import LOSS_TYPES, REFERENCE_FREE  # the loss registry's names


@dataclass
class DPOConfig(LabelSmoothingArgs, SharePromptsArgs, BetaArgs, EvalSplitArgs, EvalDataArgs, OfflineArgs, PairArgs, JudgedEvalArgs,
                ReferenceArgs, ModelArgs, OptimizerArgs, RunArgs):
    """DPO (sigmoid), IPO and label-smoothed cDPO on preference pairs, against a frozen reference."""

    eval_data = retune(None, "held-out pairs given apart (TRL's eval_dataset; default: the records of the training "
                       "data whose split is eval_split, else none)")

    # data
    prefs: str = option("builtin:prefs_reviews", "preference pairs: a JSONL/CSV from `rlhfkit prefs make` or "
                        "`rlhfkit label export` (prompt, chosen, rejected), or builtin:prefs_reviews. Records whose "
                        "split is eval_split are held out")
    # loss
    loss_type: str = option("sigmoid", "sigmoid = DPO; ipo = IPO on length-averaged log-probs; cdpo = sigmoid with "
                            "label smoothing (the original conservative DPO); hinge = SLiC's relu(1 - beta h); "
                            "robust = rDPO (TRL's robust: unbiased under label flips, label_smoothing the flip "
                            "probability); simpo = SimPO; orpo = ORPO (both reference-free: no reference is "
                            "built)", LOSS_TYPES)
    rpo_alpha: float | None = option(None, "RPO: add alpha x the chosen response's NLL per token to each pair's loss "
                                     "(TRL's rpo_alpha; TRL 1.16 writes it loss_type=[sigmoid, sft] with "
                                     "loss_weights=[1, alpha]). None: off")
    beta = retune(0.1, "inverse temperature of the implicit reward beta * log(pi / pi_ref); simpo: scale of "
                         "the length-normalised reward beta * avg log pi; orpo: weight lambda of the odds-ratio term")
    gamma: float = option(1.0, "simpo: target reward margin gamma (the other losses ignore it)")
    label_smoothing = retune(None, "cDPO / rDPO: assumed label-flip probability in [0, 0.5) "
                                           "(None: 0.1 for cdpo and robust, 0 for sigmoid; not used by the others)")
    # optimisation
    share_prompts = retune(True, "run a pair's prompt once for its chosen and rejected response (their keys/values "
                                 "are copied to both rows; equal up to float rounding), and a header all prompts share (a long system "
                                 "prompt) once per micro-batch. Off under gradient_checkpointing")
    lr = retune(1e-4, "AdamW learning rate (LoRA default; use ~5e-7..5e-6 for full fine-tuning)")

    @property
    def uses_reference(self) -> bool:
        return self.loss_type not in REFERENCE_FREE

    def validate(self) -> None:
        for k in ("epochs", "batch_size", "micro_batch_size", "max_prompt_length", "max_response_length"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.max_steps is None or self.max_steps >= 1, f"max_steps ({self.max_steps}) must be >= 1")
        check(self.batch_size % self.micro_batch_size == 0,
              f"batch_size ({self.batch_size}) must be divisible by micro_batch_size ({self.micro_batch_size})")
        check(self.beta > 0, f"beta ({self.beta}) must be > 0")
        check(0 <= self.smoothing < 0.5, f"label_smoothing ({self.label_smoothing}) must be in [0, 0.5)")
        check(not (self.loss_type not in ("sigmoid", "cdpo", "robust") and self.smoothing > 0),
              f"label_smoothing ({self.label_smoothing}) applies to sigmoid/cdpo/robust, not {self.loss_type}")
        check(self.rpo_alpha is None or self.rpo_alpha >= 0, f"rpo_alpha ({self.rpo_alpha}) must be >= 0")
        check(self.gamma >= 0, f"gamma ({self.gamma}) must be >= 0")
        check(self.reference_model is None or self.uses_reference,
              f"reference_model is not used by loss_type={self.loss_type} (reference-free)")


@dataclass
class SimPOConfig(DPOConfig):
    """SimPO: reference-free, length-normalised implicit reward with a target margin (Meng et al. 2024)."""

    command: ClassVar[str] = "simpo"
    loss_type = retune("simpo", "simpo; or any DPO loss (sigmoid, ipo, cdpo, orpo)")
    beta = retune(2.0, "scale of the reward beta * avg log pi (SimPO's 2.0-2.5)")
    gamma = retune(1.0, "target reward margin (gamma / beta = 0.5, inside SimPO's tuned range)")


@dataclass
class ORPOConfig(DPOConfig):
    """ORPO: supervised fine-tuning on the chosen response plus an odds-ratio term, no reference (Hong et al. 2024)."""

    command: ClassVar[str] = "orpo"
    loss_type = retune("orpo", "orpo; or any DPO loss (sigmoid, ipo, cdpo, simpo)")
    beta = retune(0.1, "lambda, the weight of the odds-ratio term against the SFT term (ORPO's 0.1)")
