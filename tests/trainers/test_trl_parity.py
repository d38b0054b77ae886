"""Parity with TRL 1.16 (the `dev` extra installs trl==1.16.0) for the preference, reward-model and SFT
losses: TRL's own loss code and rlhfkit's on the same tensors, loss and gradients to round-off; each known
difference is a named test.

TRL keeps its losses inside trainer methods that run the model (DPOTrainer._compute_loss,
CPOTrainer/ORPOTrainer.get_batch_loss_metrics, KTOTrainer._compute_loss, RewardTrainer.compute_loss,
SFTTrainer.compute_loss): each is called on a stand-in trainer (the attributes it reads) and a stand-in
model whose output carries the given log-probs or logits (a tiny model for SFT), so both sides
differentiate the same leaf tensor. The RL losses are in test_trl_parity_rl.py; PPO, which needs trl 1.12
(1.16 removed PPOTrainer), in test_trl_parity_ppo.py. docs/algorithms.md lists what is compared.
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


# ----------------------------------------------------------------------------- helpers shared below


def _standin(cls, **attrs):
    """An instance of TRL's trainer class without its __init__: the attributes its method reads."""
    me = object.__new__(cls)
    me.__dict__.update(attrs)
    return me


def _accelerator(**extra):
    """Single-process accelerate stand-in: gathers and reductions over one process are the identity."""
    return SimpleNamespace(device=torch.device("cpu"), num_processes=1, process_index=0, sync_gradients=True,
                           gather=lambda x: x, gather_for_metrics=lambda x: x, reduce=lambda x, reduction="sum": x,
                           **extra)


def _metrics():
    return defaultdict(lambda: defaultdict(list))


def _close(ours: torch.Tensor, theirs: torch.Tensor, leaf: torch.Tensor | list) -> None:
    """Loss to round-off relative to its size, and the gradient w.r.t. `leaf` (a tensor or parameters) to
    round-off relative to the largest gradient entry (a non-zero scale)."""
    leaves = [leaf] if isinstance(leaf, torch.Tensor) else list(leaf)
    g_theirs = torch.autograd.grad(theirs, leaves)
    g_ours = torch.autograd.grad(ours, leaves)
    eps = torch.finfo(theirs.dtype).eps
    assert abs(ours.item() - theirs.item()) <= 16 * eps * max(abs(theirs.item()), 1e-3), (ours.item(), theirs.item())
    scale = max(g.abs().max().item() for g in g_theirs)
    assert scale > 0
    for a, b in zip(g_ours, g_theirs):
        torch.testing.assert_close(a, b, rtol=64 * eps, atol=64 * eps * scale)


def _pair_batch(prompt_len: int, resp_lens: list[int], vocab: int = 11, seed: int = 0, dtype=torch.float32):
    """Logits (2B, L, V) leaf and TRL's CPO/ORPO batch for B pairs ([chosen x B, rejected x B] = resp_lens):
    a prompt of `prompt_len` tokens, then the response, right-padded; labels -100 on prompt and padding."""
    g = torch.Generator().manual_seed(seed)
    n = len(resp_lens)
    L = prompt_len + max(resp_lens) + 1
    ids = torch.randint(1, vocab, (n, L), generator=g)
    attn = torch.zeros(n, L, dtype=torch.long)
    labels = torch.full((n, L), -100)
    for i, r in enumerate(resp_lens):
        attn[i, : prompt_len + r] = 1
        labels[i, prompt_len : prompt_len + r] = ids[i, prompt_len : prompt_len + r]
    ids = ids * attn  # pad id 0
    logits = torch.randn(n, L, vocab, generator=g, dtype=dtype).mul(2).requires_grad_(True)
    b = n // 2
    batch = {}
    for side, rows in (("chosen", slice(0, b)), ("rejected", slice(b, n))):
        batch.update({f"{side}_input_ids": ids[rows], f"{side}_attention_mask": attn[rows],
                      f"{side}_labels": labels[rows]})
    return logits, batch


def _our_sequence_logps(logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """rlhfkit's summed response log-probs (2B,) and lengths (2B,) from the logits (algos.logprobs_from_logits)."""
    from rlhfkit.algos import logprobs_from_logits

    labels = torch.cat([batch["chosen_labels"], batch["rejected_labels"]])[:, 1:]
    mask = labels != -100
    per_token = logprobs_from_logits(logits[:, :-1], labels.clamp(min=0))
    return (per_token * mask).sum(1), mask.sum(1).to(logits.dtype)


def _logits_model(logits: torch.Tensor):
    """A stand-in causal LM whose forward returns the given logits."""
    return lambda input_ids, attention_mask=None, use_cache=False, **kw: SimpleNamespace(logits=logits)


# ----------------------------------------------------------------------------- SimPO (TRL: CPOTrainer, loss_type=simpo)


def test_simpo_loss_and_gradient_match_trls_cpo_simpo():
    """TRL 1.16's SimPO is CPOTrainer(loss_type="simpo", cpo_alpha=0): -log sigma(beta (avg_c - avg_r) - gamma)
    on length-averaged log-probs; rlhfkit's dpo loss_type=simpo with gamma = TRL's simpo_gamma. (float32 only:
    rlhfkit takes log-probs from logits in float32 whatever their dtype, algos/logprobs.py.)"""
    from trl.experimental.cpo import CPOTrainer

    from rlhfkit.trainers.dpo_config import DPOConfig
    from rlhfkit.trainers.pair_losses import pair_batch_loss

    logits, batch = _pair_batch(2, [3, 1, 4, 2, 4, 1])
    me = _standin(CPOTrainer, is_encoder_decoder=False, pad_token_id=0, accelerator=_accelerator(),
                  aux_loss_enabled=False, cpo_alpha=0.0, loss_type="simpo", beta=2.0, simpo_gamma=0.7,
                  label_smoothing=0.0, alpha=0.0)
    theirs, _ = me.get_batch_loss_metrics(_logits_model(logits), batch)
    seq, lengths = _our_sequence_logps(logits, batch)
    cfg = DPOConfig(loss_type="simpo", beta=2.0, gamma=0.7)
    ours = pair_batch_loss(seq, None, lengths, cfg, 3.0)[0]
    _close(ours, theirs, logits)


# ----------------------------------------------------------------------------- ORPO (TRL: ORPOTrainer)


def _trl_orpo(logits, batch, beta):
    from trl.experimental.orpo import ORPOTrainer

    me = _standin(ORPOTrainer, is_encoder_decoder=False, padding_value=0, accelerator=_accelerator(),
                  aux_loss_enabled=False, beta=beta)
    return me.get_batch_loss_metrics(_logits_model(logits), batch)[0]


def _our_orpo(logits, batch, beta):
    from rlhfkit.trainers.dpo_config import DPOConfig
    from rlhfkit.trainers.pair_losses import pair_batch_loss

    seq, lengths = _our_sequence_logps(logits, batch)
    return pair_batch_loss(seq, None, lengths, DPOConfig(loss_type="orpo", beta=beta), len(seq) / 2)[0]


def test_orpo_matches_trl_when_the_prompt_is_one_token_and_responses_share_a_length():
    """With a one-token prompt (never predicted) and chosen responses of one length, TRL's NLL (a token mean
    over prompt + response of every chosen row) is rlhfkit's (the mean over pairs of each response's token
    mean): the odds-ratio term and the whole loss agree to round-off."""
    logits, batch = _pair_batch(1, [3, 3, 3, 2, 4, 1])
    _close(_our_orpo(logits, batch, 0.25), _trl_orpo(logits, batch, 0.25), logits)


def test_known_difference_orpo_nll_covers_the_prompt_in_trl():
    """TRL's ORPO takes the NLL over the chosen prompt AND response ("computed over the full prompt and
    response"); rlhfkit's (the paper's SFT term) over the response only. The difference is exactly TRL's NLL
    minus rlhfkit's, the odds-ratio terms being the same."""
    from rlhfkit.algos import logprobs_from_logits

    logits, batch = _pair_batch(3, [3, 3, 3, 2, 4, 1])
    theirs, ours = _trl_orpo(logits, batch, 0.25).item(), _our_orpo(logits, batch, 0.25).item()
    b = 3
    ids, attn = batch["chosen_input_ids"], batch["chosen_attention_mask"]
    lp = logprobs_from_logits(logits[:b, :-1].detach(), ids[:, 1:])  # (B, L-1)
    every = attn[:, 1:].bool()  # TRL: every attended position after the first (prompt + response)
    response = batch["chosen_labels"][:, 1:] != -100
    nll_trl = -(lp[every]).mean().item()
    nll_ours = -((lp * response).sum(1) / response.sum(1)).mean().item()
    assert abs(nll_trl - nll_ours) > 0.01
    assert theirs - ours == pytest.approx(nll_trl - nll_ours, rel=1e-4)


# ----------------------------------------------------------------------------- KTO (TRL: KTOTrainer)


N_KTO, T_KTO = 6, 6


def _kto_rows(seed: int, kl_shift: float, dtype=torch.float32):
    """Per-token log-probs (N, T-1) leaf, masks, labels and reference values of N unpaired examples and their
    mismatched (KL) rows; the KL rows' log-ratios average about `kl_shift`."""
    g = torch.Generator().manual_seed(seed)
    logps = (-torch.rand(N_KTO, T_KTO - 1, generator=g, dtype=dtype) * 3).requires_grad_(True)
    mask = torch.zeros(N_KTO, T_KTO, dtype=torch.long)
    kl_mask = torch.zeros(N_KTO, T_KTO, dtype=torch.long)
    for i, (n, m) in enumerate(zip([3, 2, 4, 1, 3, 2], [2, 4, 1, 3, 3, 2])):
        mask[i, 1 : 1 + n] = 1
        kl_mask[i, 1 : 1 + m] = 1
    kl_logps = -torch.rand(N_KTO, T_KTO - 1, generator=g, dtype=dtype) * 3 * kl_mask[:, 1:]
    ref = -torch.rand(N_KTO, generator=g, dtype=dtype) * 5
    ref_kl = kl_logps.sum(1) - kl_shift + torch.randn(N_KTO, generator=g, dtype=dtype) * 0.3
    label = torch.tensor([True, False, True, True, False, False])
    return logps, mask, kl_logps, kl_mask, ref, ref_kl, label


def _trl_kto_loss(rows, idx, beta, w_d, w_u) -> tuple[torch.Tensor, float]:
    """TRL 1.16's KTOTrainer._compute_loss on the examples `idx` (one micro-batch), precomputed reference
    log-probs; (loss, its reference point z_0)."""
    from trl import KTOTrainer

    logps, mask, kl_logps, kl_mask, ref, ref_kl, label = rows
    n = len(idx)
    kl_ids = torch.zeros(n, T_KTO, dtype=torch.long)

    def model(input_ids, attention_mask, labels, fused_lm_head, use_cache=False, **kw):
        if input_ids is kl_ids:  # the mismatched rows: their per-token log-probs, zero off the completion
            return SimpleNamespace(log_probs=kl_logps[idx])
        return SimpleNamespace(log_probs=logps[idx] * mask[idx, 1:], entropy=torch.zeros(n, T_KTO - 1),
                               mean_logits=torch.zeros(n, T_KTO - 1))

    me = _standin(KTOTrainer, model=SimpleNamespace(training=True), accelerator=_accelerator(), calculate_KL=True,
                  aux_loss_enabled=False, precompute_ref_logps=True, loss_type="kto", beta=beta,
                  desirable_weight=w_d, undesirable_weight=w_u, _metrics=_metrics(), _total_train_tokens=0,
                  _tp_size=1, ref_model=None, args=SimpleNamespace(gradient_checkpointing_kwargs=None))
    inputs = {"input_ids": torch.zeros(n, T_KTO, dtype=torch.long), "attention_mask": torch.ones(n, T_KTO),
              "completion_mask": mask[idx], "KL_input_ids": kl_ids, "KL_attention_mask": torch.ones(n, T_KTO),
              "KL_completion_mask": kl_mask[idx], "label": label[idx], "ref_logps": ref[idx],
              "ref_KL_logps": ref_kl[idx]}
    loss = KTOTrainer._compute_loss(me, model, inputs, False)
    return loss, me._metrics["train"]["kl"][-1]


def _our_kto_loss(rows, idx, beta, w_d, w_u, n_batch: int) -> tuple[torch.Tensor, float]:
    """rlhfkit's KTO loss of the examples `idx`, z_0 over those same rows (trainers/kto.py: over the whole
    optimiser batch), the sum divided by the batch's size."""
    from rlhfkit.algos import kto_loss, kto_reference_point

    logps, mask, kl_logps, kl_mask, ref, ref_kl, label = rows
    z0 = kto_reference_point((kl_logps[idx].sum(1) - ref_kl[idx]).sum().item(), len(idx))
    seq = (logps[idx] * mask[idx, 1:]).sum(1)
    losses, _ = kto_loss(seq, ref[idx], label[idx], z0, beta, w_d, w_u)
    return losses.sum() / n_batch, z0


@pytest.mark.parametrize(("kl_shift", "beta", "w_d", "w_u"), [
    (0.8, 0.1, 1.0, 1.0),    # z_0 > 0
    (-0.8, 0.5, 1.33, 0.7),  # the mean log-ratio < 0: z_0 clamped at 0 on both sides; weighted
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kto_loss_reference_point_and_gradient_match_trl(kl_shift, beta, w_d, w_u, dtype):
    rows = _kto_rows(0, kl_shift, dtype)
    idx = torch.arange(N_KTO)
    theirs, z_theirs = _trl_kto_loss(rows, idx, beta, w_d, w_u)
    ours, z_ours = _our_kto_loss(rows, idx, beta, w_d, w_u, N_KTO)
    assert z_ours == pytest.approx(z_theirs, rel=1e-6, abs=1e-7)
    assert (z_ours > 0) == (kl_shift > 0)
    _close(ours, theirs, rows[0])


def test_known_difference_kto_reference_point_per_micro_batch_in_trl():
    """TRL estimates z_0 in each micro-batch (the mean over its own mismatched rows); rlhfkit over the whole
    optimiser batch, so its loss does not depend on the split. Two micro-batches of 3 whose KL rows differ:
    TRL's two z_0 differ and its accumulated loss (mean of the micro-batch means) is not rlhfkit's."""
    from rlhfkit.algos import kto_loss

    rows = list(_kto_rows(1, 0.0))
    rows[5] = rows[5] + torch.tensor([-2.0, -2.0, -2.0, 1.0, 1.0, 1.0])  # log-ratios: first half +2, second -1
    a, b, every = torch.arange(3), torch.arange(3, 6), torch.arange(6)
    (la, za), (lb, zb) = _trl_kto_loss(rows, a, 0.1, 1.0, 1.0), _trl_kto_loss(rows, b, 0.1, 1.0, 1.0)
    trl_accumulated = (la + lb) / 2  # HF Trainer: each micro-batch's loss / gradient_accumulation_steps
    ours, z = _our_kto_loss(rows, every, 0.1, 1.0, 1.0, 6)
    assert za > 1.0 and zb == 0.0 and 0 < z < za  # TRL: a z_0 per micro-batch; rlhfkit: the batch's
    assert abs(trl_accumulated.item() - ours.item()) > 1e-3
    logps, mask, _, _, ref, _, label = rows
    seq = (logps * mask[:, 1:]).sum(1)
    # the reference point is the whole difference: rlhfkit's formula with TRL's z_0 per micro-batch is TRL's loss
    per_micro = sum(kto_loss(seq[i], ref[i], label[i], zi, 0.1)[0].sum() / 6 for i, zi in ((a, za), (b, zb)))
    assert per_micro.item() == pytest.approx(trl_accumulated.item(), rel=1e-6)
    # and rlhfkit's micro-batches with the batch's z_0 add up to the whole-batch loss (split-invariant)
    by_parts = sum(kto_loss(seq[i], ref[i], label[i], z, 0.1)[0].sum() / 6 for i in (a, b))
    assert by_parts.item() == pytest.approx(ours.item(), rel=1e-6)


# ----------------------------------------------------------------------------- reward model (TRL: RewardTrainer)


def _rm_case():
    from rlhfkit.core.config import build_config
    from rlhfkit.models.reward_model import RewardModel, ScoreHead
    from rlhfkit.trainers.rm_config import RMConfig

    from tiny_lm import build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = RewardModel(build_tiny_model(len(tok), seed=4).get_decoder(), ScoreHead(32), causal=True).eval()
    pairs = [{"prompt": "Say hi", "chosen": "hello there", "rejected": "no", "margin": 1.5},
             {"prompt": "Add 2 and 2", "chosen": "4", "rejected": "5, I think", "margin": 0.5},
             {"prompt": "Name a colour", "chosen": "blue", "rejected": "a cat", "margin": 2.0}]
    info = {"chat_template": False, "system_prompt": None, "add_special_tokens": False}
    cfg = build_config(RMConfig, {"model": "unused", "data": "prefs.jsonl", "dtype": "fp32", "center_coef": 0.01,
                                  "use_data_margin": True})
    return model, tok, pairs, info, cfg


@pytest.mark.parametrize("with_margin", [False, True])
def test_reward_model_loss_and_gradient_match_trls_reward_trainer(with_margin):
    """TRL's RewardTrainer.compute_loss: -log sigma(r_c - r_r [- margin]) mean + center_rewards_coefficient x
    mean((r_c + r_r)^2); rlhfkit's rm pair_loss (margin from the data, center_coef), on the same scorer."""
    from trl import RewardTrainer

    from rlhfkit.models.reward_model import encode_texts
    from rlhfkit.trainers.rm import pair_loss, pair_texts

    model, tok, pairs, info, cfg = _rm_case()
    if not with_margin:
        pairs = [{k: v for k, v in p.items() if k != "margin"} for p in pairs]
    ours, _ = pair_loss(model, tok, pairs, info, cfg, torch.device("cpu"))
    chosen, rejected = pair_texts(tok, pairs, info)
    enc = encode_texts(tok, chosen + rejected, cfg.max_length, False)
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if with_margin:
        inputs["margin"] = torch.tensor([p["margin"] for p in pairs])
    me = _standin(RewardTrainer, model=SimpleNamespace(training=True), accelerator=_accelerator(),
                  args=SimpleNamespace(center_rewards_coefficient=0.01), _metrics=_metrics(),
                  _total_train_tokens=0, _tp_size=1)

    def trl_model(input_ids, attention_mask, use_cache=False, **kw):  # a sequence-classification output
        return SimpleNamespace(logits=model(input_ids, attention_mask)[:, None])

    theirs = me.compute_loss(trl_model, inputs)
    _close(ours, theirs, [p for p in model.parameters() if p.requires_grad])


# ----------------------------------------------------------------------------- SFT, completion-only (TRL: SFTTrainer)


SFT_ROWS = [{"prompt": "Say hi", "response": "hello there"}, {"prompt": "Add 2 and 2", "response": "4"},
            {"prompt": "Name a colour", "response": "Blue sky"}]


def _trl_sft_dataset(tok, tmp_path, texts):
    """TRL 1.16's own SFT data preparation (SFTTrainer._prepare_dataset: tokenize prompt and prompt +
    completion, completion_mask from their common prefix, labels -100 off the completion) of these
    (prompt text, full text) pairs as prompt-completion records."""
    from datasets import Dataset
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer

    args = TRLSFTConfig(output_dir=str(tmp_path), max_length=None, completion_only_loss=True, report_to=[],
                        bf16=False, use_cpu=True)
    me = _standin(SFTTrainer, completion_only_loss=True, chat_template=None, _tokenizer=tok)
    ds = Dataset.from_list([{"prompt": p, "completion": full[len(p):]} for p, full in texts])
    return list(SFTTrainer._prepare_dataset(me, ds, tok, args, False, None, "train"))


def test_sft_completion_only_loss_masks_and_gradient_match_trl(tmp_path):
    """TRL's SFT on prompt-completion records (completion_only_loss, its default there): the same token ids
    and trained tokens as rlhfkit's tokenize_examples, and TRL's SFTTrainer.compute_loss (its fused LM head:
    sum of -log p over the labelled tokens / their count) gives rlhfkit's loss (ResponseNLL + the token mean,
    trainers/sft.py) and the same gradient on every weight of the tiny model."""
    import copy

    from trl import SFTTrainer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling
    from trl.trainer.utils import add_fused_lm_head

    from rlhfkit.algos import aggregate_loss
    from rlhfkit.core.config import build_config
    from rlhfkit.data.chat import format_example
    from rlhfkit.data.sft import collate, tokenize_examples
    from rlhfkit.models.response_nll import ResponseNLL
    from rlhfkit.trainers.sft_config import SFTConfig

    from tiny_lm import build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    cfg = build_config(SFTConfig, {"model": "unused", "data": "d.jsonl", "dtype": "fp32", "chat_template": False})
    ours_ex, dropped = tokenize_examples(tok, SFT_ROWS, cfg, 512)
    texts = [format_example(tok, r["prompt"], r["response"], False, None) for r in SFT_ROWS]
    theirs_ex = _trl_sft_dataset(tok, tmp_path, texts)
    assert dropped == 0 and len(theirs_ex) == len(ours_ex) == 3
    for o, t in zip(ours_ex, theirs_ex):
        assert o["input_ids"] == t["input_ids"] and o["labels"] == t["labels"]
        assert 0 < sum(x != -100 for x in o["labels"]) < len(o["labels"])  # the prompt is masked

    model = build_tiny_model(len(tok), seed=3).train()
    theirs_model = copy.deepcopy(model)
    add_fused_lm_head(theirs_model, outputs=("log_probs", "entropy", "is_top1"))
    me = _standin(SFTTrainer, model=theirs_model, aux_loss_enabled=False, compute_loss_func=None,
                  label_smoother=None, accelerator=_accelerator(parallelism_config=None),
                  args=SimpleNamespace(loss_type="nll", average_tokens_across_devices=False),
                  _metrics=_metrics(), _total_train_tokens=0, _tp_size=1)
    batch = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)(
        [{"input_ids": t["input_ids"], "labels": t["labels"]} for t in theirs_ex])
    theirs = me.compute_loss(theirs_model, batch)

    b = collate(ours_ex, tok.pad_token_id)
    nll, mask = ResponseNLL(model)(**b)
    ours = aggregate_loss(nll, mask, num_tokens=float(mask.sum()))
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    theirs.backward()
    ours.backward()
    grads = {n: p.grad for n, p in theirs_model.named_parameters()}
    scale = max(g.abs().max().item() for g in grads.values())
    assert scale > 0
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-5 * scale)


def test_known_difference_sft_tokens_merged_across_the_prompt_boundary(tmp_path):
    """When the prompt text ends in a space and the response's first word merges with it ("Assistant: " +
    "a deep blue" -> the token " a"), TRL keeps the whole text's tokens and starts the completion where the
    prompt's tokens diverge (the prompt's last token is left out); rlhfkit tokenises prompt and response apart
    (data/chat.py tokenize_sft_example), so the prompt tokens are those seen at generation. Both train on
    the response text; the token sequences differ."""
    from rlhfkit.core.config import build_config
    from rlhfkit.data.chat import format_example
    from rlhfkit.data.sft import tokenize_examples
    from rlhfkit.trainers.sft_config import SFTConfig

    from tiny_lm import build_tokenizer

    tok = build_tokenizer()
    row = {"prompt": "Name a colour", "response": "a deep blue"}
    cfg = build_config(SFTConfig, {"model": "unused", "data": "d.jsonl", "dtype": "fp32", "chat_template": False})
    (ours,), _ = tokenize_examples(tok, [row], cfg, 512)
    prompt, full = format_example(tok, row["prompt"], row["response"], False, None)
    (theirs,) = _trl_sft_dataset(tok, tmp_path, [(prompt, full)])

    def encode(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    assert theirs["input_ids"] == encode(full)  # TRL: the whole text's tokens
    assert ours["input_ids"] == encode(prompt) + encode(full[len(prompt):])  # rlhfkit: prompt, then response
    assert theirs["input_ids"] != ours["input_ids"]
    trained = [tok.decode([i for i, x in zip(e["input_ids"], e["labels"]) if x != -100]) for e in (ours, theirs)]
    assert trained[0] == "a deep blue<|im_end|>" and trained[1].strip() == "a deep blue<|im_end|>"
