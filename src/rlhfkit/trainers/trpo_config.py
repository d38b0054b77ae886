"""TRPOConfig: every option of `rlhfkit trpo`, documented once (this text is --help)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rlhfkit.core.choices import TRPO_FVP_MODES
from rlhfkit.core.config import check, option, retune
from rlhfkit.trainers.ppo_config import ActorCriticArgs


@dataclass
class TRPOConfig(ActorCriticArgs):
    """TRPO: a natural-gradient policy step inside a KL trust region, the critic trained by regression as in PPO."""

    kl_penalty: ClassVar[str] = "reward"  # the KL always shapes the reward (trainers/ppo.py reads it)

    max_kl: float = option(0.01, "delta: the largest mean token KL(pi_old || pi) over response tokens one policy "
                           "step may take (measured on the rollout by the line search)")
    damping: float = option(0.1, "lambda in (F + lambda I) x = g: keeps the conjugate-gradient system well "
                            "conditioned where the Fisher matrix is nearly singular")
    cg_iters: int = option(10, "conjugate-gradient iterations (Fisher-vector products) per policy step")
    backtrack_coef: float = option(0.5, "line search: each rejected step is shrunk by this factor")
    max_backtracks: int = option(10, "line search: candidate steps tried before giving up (no step, logged)")
    accept_ratio: float = option(0.0, "line search: also require this share of the first-order predicted gain "
                                 "(0: any improvement of the surrogate)")
    fvp_cache_graph: bool = option(True, "fvp_mode=double-backward: keep each micro-batch's first-backward graph "
                                   "for all Fisher-vector "
                                   "products (faster; memory of all micro-batches' activations); false recomputes "
                                   "it per product (memory of one micro-batch)")
    fvp_fraction: float = option(0.25, "share of the rollout's sequences (drawn per iteration from the seed) that "
                                 "estimate the Fisher matrix in the Fisher-vector products; the gradient and the "
                                 "line search's KL check always use every sequence (1: all)")
    fvp_mode: str = option("gauss-newton", "Fisher-vector product: gauss-newton (J^T (diag p - p p^T) J v, the "
                           "closed form; ~2.5x faster on the default model) or double-backward (differentiate the "
                           "token KL twice; the same product)", TRPO_FVP_MODES)
    vf_epochs: int = option(2, "critic regression passes over each rollout (AdamW with lr, on the value head only)")
    vf_mini_batch_size: int = option(8, "sequences per critic optimiser step")
    lr = retune(1e-3, "AdamW learning rate of the critic (the policy's step size comes from max_kl)")

    def validate(self) -> None:
        check(self.max_kl > 0, f"max_kl ({self.max_kl}) must be > 0")
        check(0 < self.fvp_fraction <= 1, f"fvp_fraction ({self.fvp_fraction}) must be in (0, 1]")
        check(self.damping >= 0, f"damping ({self.damping}) must be >= 0")
        check(0 < self.backtrack_coef < 1, f"backtrack_coef ({self.backtrack_coef}) must be in (0, 1)")
        check(self.accept_ratio >= 0, f"accept_ratio ({self.accept_ratio}) must be >= 0")
        for k in ("cg_iters", "max_backtracks", "vf_epochs", "vf_mini_batch_size"):
            check(getattr(self, k) >= 1, f"{k} ({getattr(self, k)}) must be >= 1")
        check(self.rollout_batch_size % self.vf_mini_batch_size == 0,
              f"rollout_batch_size ({self.rollout_batch_size}) must be divisible by vf_mini_batch_size "
              f"({self.vf_mini_batch_size})")
        check(self.micro_batch_size != "auto", "micro_batch_size=auto is for ppo and the grpo family: trpo takes a number")
        check(self.vf_mini_batch_size % self.micro_batch_size == 0,
              f"vf_mini_batch_size ({self.vf_mini_batch_size}) must be divisible by micro_batch_size "
              f"({self.micro_batch_size})")
