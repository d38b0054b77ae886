"""The DPO family's losses by name, defined once: `loss_type` chooses one, and the configs' choice
tuples are this registry's keys (trainers/dpo_config.py, trainers/online_dpo_config.py).

Every loss takes the sequence log-probs of k pairs laid out [chosen x k, rejected x k] (2k,), the
reference's in the same layout (None for a reference-free loss), the response lengths (2k,) and the
config (beta, gamma, smoothing); it returns (per-pair losses (k,), metrics). The maths is algos/'s;
imports of it are deferred so that the configs, which read the names, stay free of torch.
Formulas and defaults: docs/algorithms.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PairLoss:
    """A loss of the DPO family and whether it needs a reference model."""

    fn: Callable[..., tuple[Any, dict[str, float]]]
    needs_reference: bool


def halves(x):
    """(first half, second half) of a (2k,) tensor: chosen rows, rejected rows."""
    k = x.shape[0] // 2
    return x[:k], x[k:]


def sigmoid_loss(logps, ref_logps, lengths, cfg):
    """DPO (Rafailov et al. 2023) on summed log-probs; cDPO with label smoothing cfg.smoothing."""
    from rlhfkit.algos import dpo_loss

    return dpo_loss(*halves(logps), *halves(ref_logps), cfg.beta, "sigmoid", cfg.smoothing)


def ipo_loss(logps, ref_logps, lengths, cfg):
    """IPO (Azar et al. 2023) on length-averaged log-probs."""
    from rlhfkit.algos import dpo_loss

    return dpo_loss(*halves(logps / lengths), *halves(ref_logps / lengths), cfg.beta, "ipo", cfg.smoothing)


def hinge_loss(logps, ref_logps, lengths, cfg):
    """SLiC's hinge on the DPO log-ratio difference h: relu(1 - beta h) (TRL's loss_type=hinge)."""
    from rlhfkit.algos import dpo_loss

    return dpo_loss(*halves(logps), *halves(ref_logps), cfg.beta, "hinge")


def robust_loss(logps, ref_logps, lengths, cfg):
    """rDPO (Chowdhury et al. 2024; TRL's loss_type=robust) with flip probability cfg.smoothing."""
    from rlhfkit.algos import dpo_loss

    return dpo_loss(*halves(logps), *halves(ref_logps), cfg.beta, "robust", cfg.smoothing)


def simpo_loss(logps, ref_logps, lengths, cfg):
    """SimPO (Meng et al. 2024): length-normalised, with the margin cfg.gamma; no reference."""
    from rlhfkit.algos import simpo_loss as loss

    return loss(*halves(logps), *halves(lengths), cfg.beta, cfg.gamma)


def orpo_loss(logps, ref_logps, lengths, cfg):
    """ORPO (Hong et al. 2024): SFT plus an odds-ratio term; no reference."""
    from rlhfkit.algos import orpo_loss as loss

    return loss(*halves(logps), *halves(lengths), cfg.beta)


PAIR_LOSSES: dict[str, PairLoss] = {  # loss_type -> loss; the order is the choices' order in --help
    "sigmoid": PairLoss(sigmoid_loss, needs_reference=True),
    "ipo": PairLoss(ipo_loss, needs_reference=True),
    "cdpo": PairLoss(sigmoid_loss, needs_reference=True),  # sigmoid with label smoothing (default 0.1)
    "hinge": PairLoss(hinge_loss, needs_reference=True),
    "robust": PairLoss(robust_loss, needs_reference=True),  # rDPO, label smoothing as flip probability
    "simpo": PairLoss(simpo_loss, needs_reference=False),
    "orpo": PairLoss(orpo_loss, needs_reference=False),
}
LOSS_TYPES = tuple(PAIR_LOSSES)
REFERENCE_LOSS_TYPES = tuple(name for name, loss in PAIR_LOSSES.items() if loss.needs_reference)
REFERENCE_FREE = tuple(name for name, loss in PAIR_LOSSES.items() if not loss.needs_reference)


def pair_batch_loss(policy_logps, ref_logps, lengths, cfg, n_pairs: float, rpo_alpha: float | None = None):
    """(loss of k pairs divided by the number of pairs in the whole optimiser batch, metrics): the
    micro-batch losses add up to the batch's mean. Inputs as the losses above take them. `rpo_alpha`
    (DPO's option): each pair's loss gains alpha x its chosen response's NLL per token (RPO)."""
    from rlhfkit.algos.registry import choose  # torch: deferred with the losses (module docstring)

    losses, metrics = choose(PAIR_LOSSES, cfg.loss_type, "loss type").fn(policy_logps, ref_logps, lengths, cfg)
    if rpo_alpha:  # RPO (Pang et al. 2024): + alpha x the chosen response's NLL per token
        chosen_nll = -halves(policy_logps)[0] / halves(lengths)[0].clamp(min=1)
        losses = losses + rpo_alpha * chosen_nll
        metrics = {**metrics, "loss/chosen_nll": chosen_nll.mean().item()}
    return losses.sum() / n_pairs, metrics
