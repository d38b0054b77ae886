"""SimPO and ORPO on the DPO trainer (`rlhfkit simpo`, `rlhfkit orpo`): golden losses through the
trainer's batch loss, split invariance, no reference model, presets (tiny random Llama, seconds)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import rlhfkit.trainers.dpo as dpo_mod
from rlhfkit.commands import command_main
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.models.policy import ActorCritic
from rlhfkit.trainers.dpo import dpo_batch_loss, encode_pairs, pair_rows, sequence_logps, train
from rlhfkit.trainers.dpo_config import DPOConfig, ORPOConfig, SimPOConfig

from tiny_lm import build_tiny_model, build_tokenizer

GOOD = ["aa ee", "ee aa", "oo aa ee", "aa oo ee", "ee ii", "aa aa"]
BAD = ["th strct grd", "brr sh tkt", "xyz rhythm", "grr psst shh", "crwth trk", "bzz nth dst"]


def write_prefs(tmp_path, n_train=24, n_test=8):
    rows = [{"prompt": f"Write a review of thing number {i}.", "chosen": GOOD[i % 6], "rejected": BAD[(i * 5) % 6],
             "split": "train" if i < n_train else "test"} for i in range(n_train + n_test)]
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_cfg(tmp_path, tiny_model_dir, cls, **kw):
    base = dict(model=str(tiny_model_dir), prefs=str(write_prefs(tmp_path)), epochs=1, batch_size=8,
                micro_batch_size=4, num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"),
                run_name="t", quiet=True, tensorboard=False, max_new_tokens=8)
    base.update(kw)
    return build_config(cls, base)


def test_golden_simpo_and_orpo_through_the_batch_loss():
    # Two pairs of a batch of 4 (the loss divides by 4). Layout [chosen 1, chosen 2, rejected 1, rejected 2].
    pol = torch.tensor([-6.0, -1.0, -12.0, -3.0])
    lengths = torch.tensor([3.0, 2.0, 4.0, 3.0])
    # SimPO, beta 2, gamma 1: pair 1: 2 * -2 - 2 * -3 - 1 = 1; pair 2: 2 * -0.5 - 2 * -1 - 1 = 0
    loss, m = dpo_batch_loss(pol, None, lengths, build_config(SimPOConfig, {}), n_pairs=4.0)
    assert loss.item() == pytest.approx((math.log1p(math.exp(-1.0)) + math.log(2.0)) / 4, rel=1e-6)
    assert m["rewards/margin"] == pytest.approx((2.0 + 1.0) / 2)
    # ORPO, lambda 0.1: pair 2 has avg(y_w) = -0.5, avg(y_l) = -1 (the golden pair of test_algos_preference)
    loss, m = dpo_batch_loss(pol, None, lengths, build_config(ORPOConfig, {}), n_pairs=4.0)

    def log_odds(avg):
        return avg - math.log(1 - math.exp(avg))

    l1 = 2.0 + 0.1 * math.log1p(math.exp(-(log_odds(-2.0) - log_odds(-3.0))))
    l2 = 0.5 + 0.1 * math.log1p(math.exp(-(log_odds(-0.5) - log_odds(-1.0))))
    assert loss.item() == pytest.approx((l1 + l2) / 4, rel=1e-6)
    assert m["orpo/nll"] == pytest.approx((2.0 + 0.5) / 2)


@pytest.mark.parametrize("cls", [SimPOConfig, ORPOConfig])
def test_loss_and_gradient_do_not_depend_on_the_micro_batch_split(cls):
    tok = build_tokenizer()
    tok.padding_side = "left"
    model = ActorCritic(build_tiny_model(len(tok), seed=4), value_head=None).eval()
    pairs = [{"prompt": f"Review thing {i}", "chosen": GOOD[i] * (1 + i % 2), "rejected": BAD[i]} for i in range(4)]
    cfg = build_config(cls, {"dtype": "fp32"})
    data = encode_pairs(tok, pairs, cfg)

    def run(splits):
        model.zero_grad()
        total, start = 0.0, 0
        for size in splits:
            rows = pair_rows(torch.arange(start, start + size), 4)
            logps, lengths = sequence_logps(model, data, rows, cfg, torch.device("cpu"))
            loss, _ = dpo_batch_loss(logps, None, lengths, cfg, n_pairs=4.0)
            loss.backward()
            total += loss.item()
            start += size
        return total, [p.grad.clone() for p in model.parameters()]

    full_loss, full_grad = run([4])
    for splits in ([2, 2], [1, 3], [1, 1, 1, 1]):
        loss, grad = run(splits)
        assert loss == pytest.approx(full_loss, rel=1e-5)
        for g, f in zip(grad, full_grad):
            torch.testing.assert_close(g, f, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cls,name", [(SimPOConfig, "simpo"), (ORPOConfig, "orpo")])
def test_reference_free_runs_build_no_reference_and_learn(tmp_path, tiny_model_dir, monkeypatch, patch_everywhere, cls, name):
    """Full fine-tuning on vowel-rich chosen / consonant-heavy rejected answers: the held-out pairs end
    up preferred; the run folder is named after the command; no reference is built or run."""
    import rlhfkit.models.policy as policy_mod
    import rlhfkit.trainers.pairs as pairs_mod

    def no_reference(*a, **k):
        raise AssertionError(f"{name} must not build a reference")

    patch_everywhere(policy_mod, "Reference", no_reference)  # also where trainers/build.py imported it
    monkeypatch.setattr(dpo_mod, "reference_logps", no_reference)
    monkeypatch.setattr(pairs_mod, "reference_logps", no_reference)  # where the shared passes call it
    summary = train(tiny_cfg(tmp_path, tiny_model_dir, cls, run_name=None, lora=False, lr=1e-2, epochs=2,
                             warmup_steps=1))
    run_dir = tmp_path / "runs" / summary["run_dir"].split("/")[-1]
    assert run_dir.name.startswith(f"{name}-") and not summary["precomputed_ref_logps"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rewards/margin"] > rows[0]["rewards/margin"]
    assert summary["held_out"]["rewards/accuracy"] >= 0.75, summary["held_out"]


def test_presets_and_config_errors():
    s, o = SimPOConfig(), ORPOConfig()
    assert (s.loss_type, s.beta, s.gamma, s.uses_reference) == ("simpo", 2.0, 1.0, False)
    assert (o.loss_type, o.beta, o.uses_reference) == ("orpo", 0.1, False)
    assert DPOConfig().uses_reference
    with pytest.raises(ConfigError, match=r"label_smoothing \(0.1\) applies to sigmoid/cdpo/robust, not simpo"):
        build_config(SimPOConfig, {"label_smoothing": 0.1})
    with pytest.raises(ConfigError, match="reference_model is not used by loss_type=orpo"):
        build_config(ORPOConfig, {"reference_model": "somewhere"})
    with pytest.raises(ConfigError, match=r"gamma \(-1.0\) must be >= 0"):
        build_config(SimPOConfig, {"gamma": -1.0})


def test_help_of_each_preset_lists_every_field(capsys):
    import dataclasses

    for name, cls in (("simpo", SimPOConfig), ("orpo", ORPOConfig)):
        assert command_main(name)(["--help"]) == 0
        out = capsys.readouterr().out
        for f in dataclasses.fields(cls):
            assert f"  {f.name} (" in out, f.name
