"""RMConfig: every option of `rlhfkit rm`, documented once (this text is --help)."""

from __future__ import annotations

from dataclasses import dataclass

from rlhfkit.core.choices import RM_NORMALIZATIONS, RM_POOLINGS
from rlhfkit.core.config import check, option, retune
from rlhfkit.trainers.options import ExamplesArgs, ModelArgs, OfflineArgs, OptimizerArgs, RunArgs


@dataclass
class RMConfig(ExamplesArgs, OfflineArgs, ModelArgs, OptimizerArgs, RunArgs):
    """Reward model: backbone + scalar head trained with the Bradley-Terry loss on preference pairs."""

    max_eval_pairs: int = option(256, "held-out pairs used for evaluation (a seeded subset)")
    max_length = retune(256, "tokens per formatted prompt + response; longer texts lose their beginning")
    epochs = retune(2, "passes over the training pairs (ignored when max_steps > 0)")
    batch_size = retune(16, "pairs per optimiser step (all processes together)")
    micro_batch_size = retune(8, "pairs per forward/backward (each pair = 2 sequences)")
    lr = retune(1e-4, "AdamW learning rate for adapters/backbone (LoRA default; ~1e-5 for full fine-tuning)")
    head_lr: float | None = option(None, "learning rate of the score head (None: lr)")
    margin: float = option(0.0, "constant margin m in -log sigma(r_c - r_r - m)")
    use_data_margin: bool = option(True, "use a pair's own 'margin' field when it has one (Llama 2 style)")
    center_coef: float = option(0.0, "auxiliary loss coef * mean((r_c + r_r)^2) that keeps raw scores centred at 0 "
                                "(Eisenstein et al. 2023); 0 = off")
    normalize: str = option("center", "how the saved scorer maps raw scores: none | center (minus the mean on the "
                            "training responses) | standardize (also divided by their std)",
                            RM_NORMALIZATIONS)
    pooling: str = option("auto", "where the score is read: last non-pad token, or the masked mean (auto: last for "
                          "causal LMs, mean for encoders)", RM_POOLINGS)
    stats_pairs: int = option(256, "training pairs scored after training for the normalisation statistics")
    save_merged = retune(False, "save the LoRA backbone merged into full weights instead of an adapter")

    def validate(self) -> None:
        check(bool(self.data), "data: give a preference file, e.g. data=prefs.jsonl (build one with `rlhfkit prefs make`)")
        for k in ("batch_size", "micro_batch_size", "max_length", "epochs", "max_eval_pairs", "stats_pairs"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.batch_size % self.micro_batch_size == 0,
              f"batch_size ({self.batch_size}) must be divisible by micro_batch_size ({self.micro_batch_size})")
        check(self.max_steps >= 0, f"max_steps ({self.max_steps}) must be >= 0")
        check(self.head_lr is None or self.head_lr > 0, f"head_lr ({self.head_lr}) must be > 0")
        check(self.center_coef >= 0, f"center_coef ({self.center_coef}) must be >= 0")
        check(0 <= self.eval_fraction < 1, f"eval_fraction ({self.eval_fraction}) must be in [0, 1)")
