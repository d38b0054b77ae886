"""Parity with TRL 1.16 (the `dev` extra installs trl==1.16.0): TRL's own loss code and rlhfkit's on the
same tensors, loss and gradients to float32 round-off; each known difference is a named test.

TRL's DPO loss lives inside DPOTrainer._compute_loss, which runs the model: it is called here on a
stand-in trainer (the attributes it reads) and a stand-in model whose output carries the given
per-token log-probs, so both sides differentiate the same leaf tensor. PPO's parity needs trl 1.12
(1.16 removed PPOTrainer), which cannot be installed beside 1.16: bench/bench_ppo.py runs it in its
own environment (the `bench` extra).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

trl = pytest.importorskip("trl")
pytestmark = pytest.mark.skipif(not trl.__version__.startswith("1.16."), reason="parity pinned to trl 1.16")

B, T = 3, 6  # pairs, tokens per row (prompt + completion)


def _rows(seed: int = 0):
    """(per-token log-probs (2B, T-1) leaf, completion_mask (2B, T), ref chosen (B,), ref rejected (B,))."""
    g = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(2 * B, T - 1, generator=g) * 3).requires_grad_(True)
    mask = torch.zeros(2 * B, T, dtype=torch.long)
    for i, n in enumerate([3, 2, 4, 1, 3, 2]):  # prompt of 1 token, completions of various lengths
        mask[i, 1 : 1 + n] = 1
    ref = -torch.rand(2 * B, generator=g) * 4
    return logps, mask, ref[:B], ref[B:]


def _trl_dpo_loss(loss_type: str, beta: float, smoothing: float, logps, mask, ref_c, ref_r) -> torch.Tensor:
    """TRL 1.16's DPOTrainer._compute_loss on these tensors (precomputed reference log-probs)."""
    from trl import DPOTrainer

    seq = T - 1
    out = SimpleNamespace(log_probs=logps, entropy=torch.zeros(2 * B, seq), mean_logits=torch.zeros(2 * B, seq),
                          is_top1=torch.zeros(2 * B, seq, dtype=torch.bool))
    accelerator = SimpleNamespace(device=torch.device("cpu"), gather=lambda x: x, gather_for_metrics=lambda x: x)
    me = SimpleNamespace(model=SimpleNamespace(training=True), accelerator=accelerator, aux_loss_enabled=False,
                         ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl",
                         loss_types=[loss_type], loss_weights=[1.0], beta=beta, label_smoothing=smoothing,
                         use_weighting=False, _metrics=defaultdict(lambda: defaultdict(list)), _total_train_tokens=0,
                         _tp_size=1, ref_model=None, args=SimpleNamespace(gradient_checkpointing_kwargs=None))
    # TRL sums the log-probs over every position it is given: the stand-in's log-probs are already masked
    masked = logps * mask[:, 1:]
    out.log_probs = masked
    inputs = {"input_ids": torch.zeros(2 * B, T, dtype=torch.long), "attention_mask": torch.ones(2 * B, T),
              "completion_mask": mask, "ref_chosen_logps": ref_c, "ref_rejected_logps": ref_r}
    return DPOTrainer._compute_loss(me, lambda **kw: out, inputs, False)


def _ours(loss_type: str, beta: float, smoothing: float | None, logps, mask, ref_c, ref_r) -> torch.Tensor:
    from rlhfkit.trainers.dpo_config import DPOConfig
    from rlhfkit.trainers.pair_losses import pair_batch_loss

    seq = (logps * mask[:, 1:]).sum(1)  # (2B,) [chosen x B, rejected x B]
    lengths = mask[:, 1:].sum(1).float()
    cfg = DPOConfig(loss_type=loss_type, beta=beta, label_smoothing=smoothing)
    return pair_batch_loss(seq, torch.cat([ref_c, ref_r]), lengths, cfg, float(B))[0]


@pytest.mark.parametrize(("loss_type", "beta", "smoothing"), [
    ("sigmoid", 0.1, 0.0),   # DPO
    ("hinge", 0.3, 0.0),     # SLiC
    ("robust", 0.1, 0.2),    # rDPO: TRL's robust is rlhfkit's robust
    ("ipo", 0.5, 0.0),       # IPO on length-averaged log-ratios, both sides
])
def test_dpo_family_loss_and_gradient_match_trl(loss_type, beta, smoothing):
    logps, mask, ref_c, ref_r = _rows()
    theirs = _trl_dpo_loss(loss_type, beta, smoothing, logps, mask, ref_c, ref_r)
    (g_theirs,) = torch.autograd.grad(theirs, logps)
    ours = _ours(loss_type, beta, smoothing if smoothing else None, logps, mask, ref_c, ref_r)
    (g_ours,) = torch.autograd.grad(ours, logps)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6, abs=1e-7)
    scale = g_theirs.abs().max().item()
    assert scale > 0
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-6 * scale)


def test_known_difference_cdpo_is_not_trls_robust():
    """rlhfkit's cdpo is the original conservative DPO (the flipped term added); TRL 1.16's robust is
    rDPO (subtracted, divided by 1 - 2e). With e = 0 both are DPO; with e > 0 they differ."""
    logps, mask, ref_c, ref_r = _rows(1)
    robust = _trl_dpo_loss("robust", 0.1, 0.2, logps, mask, ref_c, ref_r)
    cdpo = _ours("cdpo", 0.1, 0.2, logps, mask, ref_c, ref_r)
    assert abs(cdpo.item() - robust.item()) > 1e-3
    assert _ours("cdpo", 0.1, None, logps, mask, ref_c, ref_r).item() != pytest.approx(
        _trl_dpo_loss("sigmoid", 0.1, 0.0, logps, mask, ref_c, ref_r).item(), rel=1e-6)  # cdpo's default e is 0.1
