"""DPO trainer tests on a tiny random Llama (seconds on CPU)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlhfkit.commands import command_main
from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.models.policy import ActorCritic
from rlhfkit.trainers.dpo import (
    dpo_batch_loss,
    encode_pairs,
    load_pairs,
    pair_lengths,
    pair_rows,
    plan_batches,
    sequence_logps,
    should_precompute,
    train,
    win_rate,
)
from rlhfkit.trainers.dpo_config import DPOConfig

from tiny_lm import build_tiny_model, build_tokenizer

VOWELS = ("def reward(prompts, completions, **kw):\n"
          "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n")
GOOD = ["aa ee", "ee aa", "oo aa ee", "aa oo ee", "ee ii", "aa aa"]
BAD = ["th strct grd", "brr sh tkt", "xyz rhythm", "grr psst shh", "crwth trk", "bzz nth dst"]


def write_prefs(tmp_path, n_train=24, n_test=8, extra=None):
    rows = []
    for i in range(n_train + n_test):
        rows.append({"prompt": f"Write a review of thing number {i}.", "chosen": GOOD[i % 6], "rejected": BAD[(i * 5) % 6],
                     "split": "train" if i < n_train else "test", **(extra or {})})
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_cfg(tmp_path, tiny_model_dir, **kw) -> DPOConfig:
    base = dict(model=str(tiny_model_dir), prefs=str(write_prefs(tmp_path)), epochs=1, batch_size=8,
                micro_batch_size=4, num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"),
                run_name="t", quiet=True, tensorboard=False, max_new_tokens=8)
    base.update(kw)
    return build_config(DPOConfig, base)


def metrics_rows(tmp_path, name="t"):
    return [json.loads(line) for line in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- golden losses


def test_golden_dpo_ipo_cdpo_losses():
    # Two pairs in a micro-batch of an optimiser batch of 4 pairs (the loss divides by 4).
    # Layout [chosen 1, chosen 2, rejected 1, rejected 2].
    pol = torch.tensor([-10.0, -20.0, -12.0, -19.0])
    ref = torch.tensor([-11.0, -20.0, -11.5, -18.0])
    lengths = torch.tensor([4.0, 8.0, 5.0, 2.0])
    beta = 0.1
    # pair 1: h = (-10 + 11) - (-12 + 11.5) = 1.5; pair 2: h = (0) - (-19 + 18) = 1.0
    cfg = build_config(DPOConfig, {"beta": beta, "loss_type": "sigmoid"})
    loss, m = dpo_batch_loss(pol, ref, lengths, cfg, n_pairs=4.0)
    l1, l2 = math.log1p(math.exp(-0.15)), math.log1p(math.exp(-0.1))  # -log sigmoid(beta * h)
    assert loss.item() == pytest.approx((l1 + l2) / 4, rel=1e-6)
    assert m["rewards/chosen"] == pytest.approx((0.1 * 1.0 + 0.1 * 0.0) / 2)
    assert m["rewards/rejected"] == pytest.approx((0.1 * -0.5 + 0.1 * -1.0) / 2)
    assert m["rewards/margin"] == pytest.approx((0.15 + 0.1) / 2)
    assert m["rewards/accuracy"] == 1.0
    assert m["logps/chosen"] == pytest.approx(-15.0) and m["logps/rejected"] == pytest.approx(-15.5)
    # cDPO, label smoothing 0.1 (the cdpo default): 0.9 * -log s(bh) + 0.1 * -log s(-bh)
    cfg = build_config(DPOConfig, {"beta": beta, "loss_type": "cdpo"})
    loss, _ = dpo_batch_loss(pol, ref, lengths, cfg, n_pairs=2.0)
    c1 = 0.9 * l1 + 0.1 * math.log1p(math.exp(0.15))
    c2 = 0.9 * l2 + 0.1 * math.log1p(math.exp(0.1))
    assert loss.item() == pytest.approx((c1 + c2) / 2, rel=1e-6)
    # IPO on length-averaged log-probs: h1 = (-10/4 + 11/4) - (-12/5 + 11.5/5) = 0.25 + 0.1 = 0.35
    # h2 = (-20/8 + 20/8) - (-19/2 + 18/2) = 0.5; loss = (h - 1/(2 beta))^2 = (h - 5)^2
    cfg = build_config(DPOConfig, {"beta": beta, "loss_type": "ipo"})
    loss, _ = dpo_batch_loss(pol, ref, lengths, cfg, n_pairs=2.0)
    assert loss.item() == pytest.approx(((0.35 - 5) ** 2 + (0.5 - 5) ** 2) / 2, rel=1e-6)


def test_win_rate_counts_ties_as_half():
    assert win_rate([1.0, 0.5, 0.2, 0.0], [0.0, 0.5, 0.3, 0.0]) == {"win_rate": 0.5, "wins": 1, "ties": 2, "losses": 1}


# ----------------------------------------------------------------------------- data and log-probs


@pytest.fixture()
def tiny():
    tok = build_tokenizer()
    tok.padding_side = "left"
    return ActorCritic(build_tiny_model(len(tok), seed=4), value_head=None).eval(), tok


def test_encode_pairs_layout_and_truncation(tiny):
    _, tok = tiny
    pairs = [{"prompt": "Hi", "chosen": "a lovely idea", "rejected": "no"},
             {"prompt": "Write a short review of the new cafe please", "chosen": "great", "rejected": "the film was terrible"}]
    cfg = build_config(DPOConfig, {"max_prompt_length": 64, "max_response_length": 64})
    data = encode_pairs(tok, pairs, cfg)
    assert data.response_ids.shape[0] == 4
    for row, text in zip(range(4), ["a lovely idea", "great", "no", "the film was terrible"]):
        n = int(data.response_mask[row].sum())
        ids = data.response_ids[row, :n].tolist()
        assert ids[-1] == tok.eos_token_id  # the response ends its turn
        assert tok.decode(ids[:-1]) == text
        assert tok.decode(data.query_ids[row][data.query_mask[row].bool()]).endswith("<|im_start|>assistant\n")
    assert (data.query_mask[:, -1] == 1).all() and (data.query_mask[:, 0] == 0).any()  # left padding
    short = encode_pairs(tok, pairs, build_config(DPOConfig, {"max_prompt_length": 5, "max_response_length": 3}))
    assert short.query_mask.sum(1).max() == 5 and short.response_mask.sum(1).max() == 3


def test_sequence_logps_equal_an_unpadded_forward(tiny):
    model, tok = tiny
    pairs = [{"prompt": "Hi", "chosen": "a lovely idea", "rejected": "no"},
             {"prompt": "What is 3 + 4? Answer please", "chosen": "7", "rejected": "the answer is eight"}]
    cfg = build_config(DPOConfig, {"dtype": "fp32"})
    data = encode_pairs(tok, pairs, cfg)
    got, lengths = sequence_logps(model, data, pair_rows(torch.arange(2), 2), cfg, torch.device("cpu"))
    for row in range(4):
        q = data.query_ids[row][data.query_mask[row].bool()]
        n = int(lengths[row])
        r = data.response_ids[row, :n]
        logits = model.policy(torch.cat([q, r])[None]).logits[0]
        lp = torch.log_softmax(logits[len(q) - 1 : -1].float(), -1).gather(1, r[:, None]).sum()
        assert got[row].item() == pytest.approx(lp.item(), abs=1e-4)


def test_loss_and_gradient_do_not_depend_on_the_micro_batch_split(tiny):
    model, tok = tiny
    pairs = [{"prompt": f"Review thing {i}", "chosen": GOOD[i] * (1 + i % 2), "rejected": BAD[i]} for i in range(4)]
    cfg = build_config(DPOConfig, {"dtype": "fp32", "beta": 0.5})
    data = encode_pairs(tok, pairs, cfg)
    ref = torch.randn(8)  # any fixed reference log-probs

    def run(splits):
        model.zero_grad()
        total, start = 0.0, 0
        for size in splits:
            idx = torch.arange(start, start + size)
            rows = pair_rows(idx, 4)
            logps, lengths = sequence_logps(model, data, rows, cfg, torch.device("cpu"))
            loss, _ = dpo_batch_loss(logps, ref[rows], lengths, cfg, n_pairs=4.0)
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


def test_pairs_from_label_export_and_builtin_file(tmp_path):
    rows = [  # `rlhfkit label export` rows, a tie written in both directions
        {"prompt": "p1", "chosen": "a", "rejected": "b", "labeller": "alice", "votes": 1, "pair_id": "x",
         "strength": 1.0, "margin": 1.0},
        {"prompt": "p2", "chosen": "c", "rejected": "d", "labeller": "bob", "votes": 1, "pair_id": "y",
         "strength": 0.5, "margin": 0.0, "tie": True},
        {"prompt": "p2", "chosen": "d", "rejected": "c", "labeller": "bob", "votes": 1, "pair_id": "y",
         "strength": 0.5, "margin": 0.0, "tie": True},
    ]
    f = tmp_path / "export.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train_pairs, held = load_pairs(str(f))
    assert [p["chosen"] for p in train_pairs] == ["a", "c", "d"] and held == []
    train_pairs, held = load_pairs("builtin:prefs_reviews")
    assert len(train_pairs) >= 100 and len(held) >= 20
    assert {p["prompt"] for p in train_pairs}.isdisjoint({p["prompt"] for p in held})


def test_precompute_rule():
    cfg = build_config(DPOConfig, {"batch_size": 16, "micro_batch_size": 4})
    assert should_precompute(cfg, n_pairs=100, n_steps=7)  # 112 pairs visited >= 100 in the data set
    assert not should_precompute(cfg, n_pairs=100, n_steps=3)  # 48 visited: on the fly is cheaper
    forced = build_config(DPOConfig, {"precompute_ref_logps": True})
    assert should_precompute(forced, n_pairs=100, n_steps=1)


def test_batches_keep_their_pairs_and_run_longest_first():
    """Ordering by length changes the micro-batches, never which pairs a step holds."""
    from rlhfkit.rollout import Rollout

    lengths = torch.tensor([3, 9, 1, 7, 7, 2, 8, 5, 4, 6])
    cfg = build_config(DPOConfig, {"batch_size": 4, "micro_batch_size": 2, "epochs": 2})
    plain = plan_batches(10, cfg, torch.Generator().manual_seed(0))
    ordered = plan_batches(10, cfg, torch.Generator().manual_seed(0), lengths=lengths)
    assert [len(b) for b in ordered] == [4, 4, 2, 4, 4, 2]
    for p, o in zip(plain, ordered):
        assert sorted(p.tolist()) == sorted(o.tolist())
        assert lengths[o].tolist() == sorted(lengths[p].tolist(), reverse=True)
    # pair_lengths: the longer response (prompt run once per pair), or prompt + it
    q_mask = torch.tensor([[0, 1, 1], [1, 1, 1]] * 2)
    r_mask = torch.tensor([[1.0, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    data = Rollout(query_ids=q_mask, query_mask=q_mask, response_ids=r_mask.long(), response_mask=r_mask,
                   stopped=torch.ones(4, dtype=torch.bool))
    assert pair_lengths(data, share_prompts=True).tolist() == [3, 4]  # max(2, 3), max(1, 4)
    assert pair_lengths(data, share_prompts=False).tolist() == [2 + 3, 3 + 4]


# ----------------------------------------------------------------------------- training


@pytest.mark.parametrize("precompute", [True, False])
def test_first_step_starts_at_log2_and_precompute_matches_on_the_fly(tmp_path, tiny_model_dir, precompute):
    train(tiny_cfg(tmp_path, tiny_model_dir, precompute_ref_logps=precompute, lr=1e-2, max_steps=2,
                   run_name=f"p{int(precompute)}"))
    rows = metrics_rows(tmp_path, f"p{int(precompute)}")
    for key in ("loss/dpo", "rewards/chosen", "rewards/rejected", "rewards/accuracy", "rewards/margin",
                "logps/chosen", "logps/rejected", "params/grad_norm", "params/lr"):
        assert key in rows[0], key
    # LoRA starts at zero and the reference is the adapter-disabled base: pi == pi_ref at step 0.
    assert rows[0]["loss/dpo"] == pytest.approx(math.log(2), abs=1e-6)
    assert rows[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-6)
    assert rows[1]["rewards/margin"] != 0.0
    summary = json.loads((tmp_path / "runs" / f"p{int(precompute)}" / "summary.json").read_text())
    assert summary["precomputed_ref_logps"] is precompute
    other = tmp_path / "runs" / f"p{int(not precompute)}" / "metrics.jsonl"
    if other.exists():
        for a, b in zip(rows, [json.loads(line) for line in other.read_text().splitlines()]):
            assert a["loss/dpo"] == pytest.approx(b["loss/dpo"], abs=1e-5)


def test_tiny_model_learns_preferences_and_wins_over_the_start(tmp_path, tiny_model_dir, capsys):
    """Chosen answers are vowels, rejected ones consonant-heavy; judge = share of vowels. Full
    fine-tuning must separate held-out pairs and make samples win over the start's (sampled at
    T=0.3: a random tiny model's T=1 samples are mostly byte noise)."""
    rw = tmp_path / "vowels.py"
    rw.write_text(VOWELS)
    summary = train(tiny_cfg(tmp_path, tiny_model_dir, lora=False, lr=1e-2, epochs=4, judge=f"python:{rw}:reward",
                             num_eval_prompts=8, eval_samples_per_prompt=8, warmup_steps=1, temperature=0.3,
                             quiet=False))
    assert summary["held_out"]["rewards/accuracy"] == 1.0
    # 64 judged pairs: the win rate's standard error is ~0.06. Seeds 0-4 gave 0.59-0.92 with 32 pairs.
    assert summary["win_rate"] > 0.55, summary
    assert summary["eval_after"] > summary["eval_before"] + 0.2, summary  # seen: 0.14 -> 0.68
    out = capsys.readouterr().out
    assert "judged win rate over the starting model" in out and "held-out pairs: preference accuracy" in out
    samples = [json.loads(line) for line in (tmp_path / "runs" / "t" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 64 and {"prompt", "completion", "score", "score_before"} <= set(samples[0])
    assert (tmp_path / "runs" / "t" / "final" / "config.json").is_file()


def test_separate_reference_model(tmp_path, tiny_model_dir):
    """reference_model = a different network: step 0 is no longer at log 2."""
    other = tmp_path / "other"
    tok = build_tokenizer()
    build_tiny_model(len(tok), seed=7).save_pretrained(other)
    tok.save_pretrained(other)
    train(tiny_cfg(tmp_path, tiny_model_dir, reference_model=str(other), max_steps=1))
    assert metrics_rows(tmp_path)[0]["loss/dpo"] != pytest.approx(math.log(2), abs=1e-3)


# ----------------------------------------------------------------------------- config and CLI


def test_config_errors():
    with pytest.raises(ConfigError, match=r"batch_size \(10\) must be divisible by micro_batch_size \(8\)"):
        build_config(DPOConfig, {"batch_size": 10})
    with pytest.raises(ConfigError, match="applies to sigmoid/cdpo/robust, not ipo"):
        build_config(DPOConfig, {"loss_type": "ipo", "label_smoothing": 0.1})
    with pytest.raises(ConfigError, match=r"label_smoothing \(0.5\) must be in \[0, 0.5\)"):
        build_config(DPOConfig, {"loss_type": "cdpo", "label_smoothing": 0.5})
    with pytest.raises(ConfigError, match=r"beta \(0.0\) must be > 0"):
        parse_args(DPOConfig, ["beta=0"], "rlhfkit dpo")
    with pytest.raises(ConfigError, match="loss_type='exo': expected one of sigmoid, ipo, cdpo, hinge, robust"):
        parse_args(DPOConfig, ["loss_type=exo"], "rlhfkit dpo")


def test_help_lists_every_field(capsys):
    import dataclasses

    assert command_main("dpo")(["--help"]) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(DPOConfig):
        assert f"  {f.name} (" in out, f.name


@pytest.mark.parametrize("precompute", [True, False])
def test_sharing_a_pairs_prompt_changes_no_result(tmp_path, tiny_model_dir, monkeypatch, precompute):
    """share_prompts (default on) runs a pair's prompt once for its chosen and rejected rows: every
    metric equals the unshared run's to float rounding, and the shared path really ran."""
    import rlhfkit.models.shared_prompts as sp

    prompt_rows, rows_in = [], []
    original = sp.prompt_cache

    def counting(model, ids, *a):
        prompt_rows.append(len(a[2]))
        rows_in.append(len(a[3]))
        return original(model, ids, *a)

    monkeypatch.setattr(sp, "prompt_cache", counting)
    runs = {}
    for share in (False, True):
        out = tmp_path / str(share)
        out.mkdir()
        train(tiny_cfg(out, tiny_model_dir, share_prompts=share, precompute_ref_logps=precompute, lora=False,
                       lr=1e-3))
        runs[share] = metrics_rows(out)
    assert prompt_rows and all(2 * n == m for n, m in zip(prompt_rows, rows_in))  # one prompt pass per pair
    assert len(runs[True]) == len(runs[False]) > 0
    for plain, shared in zip(runs[False], runs[True]):
        for key in ("loss/dpo", "rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected",
                    "params/grad_norm"):
            assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-5), key


def test_eval_dataset_gives_the_held_out_pairs(tmp_path, tiny_model_dir):
    """TRL's eval_dataset= (rlhfkit's eval_data): held-out pairs from their own file, used instead of the
    training file's split=test records (here 8 of them; the separate file has 3)."""
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"prompt": f"Review {i}.", "chosen": GOOD[i], "rejected": BAD[i]}) + "\n"
                            for i in range(3)))
    summary = train(tiny_cfg(tmp_path, tiny_model_dir, eval_dataset=str(held), max_steps=1))
    assert summary["held_out_pairs"] == 3


def test_eval_split_names_the_held_out_pairs(tmp_path, tiny_model_dir):
    """eval_split= (TRL's dataset_test_split) picks the held-out records of the training file; the default is test."""
    rows = [{"prompt": f"Review {i}.", "chosen": GOOD[i % 6], "rejected": BAD[(i * 5) % 6],
             "split": "train" if i < 8 else "validation"} for i in range(11)]
    path = tmp_path / "val.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [len(part) for part in load_pairs(str(path))] == [8, 0]
    train_pairs, held = load_pairs(str(path), "validation")
    assert len(train_pairs) == 8 and [p["prompt"] for p in held] == ["Review 8.", "Review 9.", "Review 10."]
    assert build_config(DPOConfig, {"dataset_test_split": "validation"}).eval_split == "validation"
    summary = train(tiny_cfg(tmp_path, tiny_model_dir, prefs=str(path), eval_split="validation", max_steps=1))
    assert summary["train_pairs"] == 8 and summary["held_out_pairs"] == 3
