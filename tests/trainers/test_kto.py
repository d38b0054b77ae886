"""KTO trainer tests on a tiny random Llama (seconds on CPU): data, the mismatched KL rows, split
invariance of z_0 and the gradient, a learning run, exact resume."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from accelerate import Accelerator
from test_resume import assert_same_run, stop_after

from rlhfkit.commands import command_main
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError, DataError
from rlhfkit.models.policy import ActorCritic
from rlhfkit.runtime.faults import Interrupted
from rlhfkit.trainers.kto import encode_examples, kl_partners, load_examples, train, train_step
from rlhfkit.trainers.kto_config import KTOConfig

from tiny_lm import build_tiny_model, build_tokenizer

GOOD = ["aa ee", "ee aa", "oo aa ee", "aa oo ee", "ee ii", "aa aa"]
BAD = ["th strct grd", "brr sh tkt", "xyz rhythm", "grr psst shh", "crwth trk", "bzz nth dst"]


def write_examples(tmp_path, n=24, n_test=8):
    rows = [{"prompt": f"Write a review of thing number {i}.", "completion": GOOD[i % 6] if i % 2 else BAD[i % 6],
             "label": bool(i % 2), "split": "train" if i < n else "test"} for i in range(n + n_test)]
    path = tmp_path / "kto.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_cfg(tmp_path, tiny_model_dir, n=24, n_test=8, **kw) -> KTOConfig:
    base = dict(model=str(tiny_model_dir), data=str(write_examples(tmp_path, n, n_test)), epochs=1, batch_size=8,
                micro_batch_size=4, num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"),
                run_name="t", quiet=True, tensorboard=False, max_new_tokens=4)
    base.update(kw)
    return build_config(KTOConfig, base)


# ----------------------------------------------------------------------------- data


def test_unpaired_examples_with_labels_and_splits(tmp_path):
    train_ex, held = load_examples(str(write_examples(tmp_path, n=4, n_test=2)))
    assert [(e["completion"], e["label"]) for e in train_ex] == [(BAD[0], False), (GOOD[1], True), (BAD[2], False),
                                                                 (GOOD[3], True)]
    assert len(held) == 2 and train_ex[0]["prompt"] == "Write a review of thing number 0."
    csv = tmp_path / "kto.csv"
    csv.write_text("prompt,completion,label\np1,good answer,true\np2,bad answer,0\np3,fine,Yes\n")
    assert [e["label"] for e in load_examples(str(csv))[0]] == [True, False, True]


def test_preference_pairs_become_one_desirable_and_one_undesirable_example(tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps({"prompt": "p1", "chosen": "good", "rejected": "bad"}) + "\n"
                    + json.dumps({"prompt": "p2", "chosen": "fine", "rejected": "awful"}) + "\n")
    examples, held = load_examples(str(path))
    assert [(e["prompt"], e["completion"], e["label"]) for e in examples] == [
        ("p1", "good", True), ("p2", "fine", True), ("p1", "bad", False), ("p2", "awful", False)]
    assert held == [] and "chosen" not in examples[0]


def test_data_errors_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "completion": "x", "label": true}\n{"prompt": "b", "completion": "y", '
                    '"label": "maybe"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: field 'label' must be true or false .* got 'maybe'"):
        load_examples(str(path))
    path.write_text('{"prompt": "a", "completion": "x", "label": true}\n{"prompt": "b", "label": false}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing field 'completion'"):
        load_examples(str(path))
    path.write_text('{"prompt": "a", "completion": "x", "label": true}\n')
    with pytest.raises(DataError, match="KTO needs at least 2 training examples, found 1"):
        load_examples(str(path))


def test_kl_rows_pair_each_prompt_with_another_examples_completion():
    partner = kl_partners(7, seed=3)
    assert sorted(partner.tolist()) == list(range(7)) and (partner != torch.arange(7)).all()
    seen, i = set(), 0  # one cycle through every example
    while i not in seen:
        seen.add(i)
        i = int(partner[i])
    assert len(seen) == 7 and torch.equal(partner, kl_partners(7, seed=3))
    tok = build_tokenizer()
    tok.padding_side = "left"
    examples = [{"prompt": f"p{i}", "completion": f"c{i}", "label": True} for i in range(3)]
    data = encode_examples(tok, examples, build_config(KTOConfig, {}), seed=0)
    p = kl_partners(3, seed=0)
    for i in range(3):
        n = int(data.response_mask[3 + i].sum())
        assert tok.decode(data.response_ids[3 + i, : n - 1]) == f"c{int(p[i])}"  # end-of-turn token last
        assert torch.equal(data.query_ids[3 + i], data.query_ids[i])


# ----------------------------------------------------------------------------- loss


def test_reference_point_and_gradient_do_not_depend_on_the_micro_batch_split(tmp_path):
    tok = build_tokenizer()
    tok.padding_side = "left"
    model = ActorCritic(build_tiny_model(len(tok), seed=4), value_head=None).eval()
    examples, _ = load_examples(str(write_examples(tmp_path, n=8, n_test=0)))
    data = encode_examples(tok, examples, build_config(KTOConfig, {}), seed=0)
    desirable = torch.tensor([e["label"] for e in examples])
    ref_table = 2 * torch.randn(16, generator=torch.Generator().manual_seed(0)) - 80.0  # far below pi
    batch = torch.tensor([5, 2, 7, 0, 3, 1])
    acc = Accelerator(cpu=True)
    out = []
    for micro in (6, 3, 2, 1):
        cfg = build_config(KTOConfig, {"dtype": "fp32", "batch_size": 6, "micro_batch_size": micro, "beta": 0.5})
        model.zero_grad()
        m = train_step(model, data, batch, lambda rows, columns=None: ref_table[rows], desirable, cfg, acc)
        out.append((m, [p.grad.clone() for p in model.parameters()]))
    (m0, g0) = out[0]
    assert m0["params/kl_reference_point"] > 0  # the policy is far from this reference: z0 is active
    for m, g in out[1:]:
        assert m["params/kl_reference_point"] == pytest.approx(m0["params/kl_reference_point"], rel=1e-6)
        assert m["loss/kto"] == pytest.approx(m0["loss/kto"], rel=1e-6)
        for a, b in zip(g, g0):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


# ----------------------------------------------------------------------------- training


def test_first_step_is_at_half_and_a_tiny_model_learns(tmp_path, tiny_model_dir, capsys):
    """LoRA starts at pi = pi_ref: r = 0, z0 = 0, every loss is 1 - sigma(0) = 0.5. Full fine-tuning
    then separates the held-out desirable and undesirable examples."""
    train(tiny_cfg(tmp_path, tiny_model_dir, max_steps=1, run_name="lora"))
    first = json.loads((tmp_path / "runs" / "lora" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss/kto"] == pytest.approx(0.5, abs=1e-5) and first["params/kl_reference_point"] < 1e-5
    summary = train(tiny_cfg(tmp_path, tiny_model_dir, run_name="full", lora=False, lr=1e-2, epochs=3,
                             warmup_steps=1, quiet=False))
    assert summary["held_out"]["rewards/margin"] > 0.5, summary["held_out"]
    assert "held-out examples: implicit reward desirable" in capsys.readouterr().out


def test_precomputed_and_on_the_fly_reference_agree(tmp_path, tiny_model_dir):
    rows = {}
    for pre in (True, False):
        summary = train(tiny_cfg(tmp_path, tiny_model_dir, n=8, n_test=2, run_name=f"p{int(pre)}", batch_size=4,
                                 micro_batch_size=2, max_steps=2, lr=1e-2, precompute_ref_logps=pre))
        assert summary["precomputed_ref_logps"] is pre
        rows[pre] = [json.loads(line) for line in (tmp_path / "runs" / f"p{int(pre)}" / "metrics.jsonl")
                     .read_text().splitlines()]
    for a, b in zip(rows[True], rows[False]):
        for key in ("loss/kto", "params/kl_reference_point", "rewards/margin"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path, tiny_model_dir, monkeypatch):
    kw = dict(n=8, n_test=2, max_steps=4, batch_size=2, micro_batch_size=1, num_eval_prompts=1,
              eval_samples_per_prompt=1, lr=1e-2, warmup_steps=3, save_every=0)
    train(tiny_cfg(tmp_path, tiny_model_dir, run_name="straight", **kw))
    cut = tiny_cfg(tmp_path, tiny_model_dir, run_name="cut", **kw)
    with monkeypatch.context() as m:
        stop_after(m, 1)
        with pytest.raises(Interrupted):
            train(cut)
    train(dataclasses.replace(cut, resume=str(tmp_path / "runs" / "cut")))
    assert_same_run(tmp_path / "runs" / "straight", tmp_path / "runs" / "cut")


def test_config_errors_and_help(capsys):
    with pytest.raises(ConfigError, match=r"batch_size \(10\) must be divisible by micro_batch_size \(16\)"):
        build_config(KTOConfig, {"batch_size": 10})
    with pytest.raises(ConfigError, match=r"desirable_weight \(0.0\) must be > 0"):
        build_config(KTOConfig, {"desirable_weight": 0.0})
    assert command_main("kto")(["--help"]) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(KTOConfig):
        assert f"  {f.name} (" in out, f.name


def test_eval_split_names_the_held_out_examples(tmp_path):
    rows = [{"prompt": f"p{i}", "completion": f"c{i}", "label": bool(i % 2), "split": "train" if i < 4 else "dev"}
            for i in range(6)]
    path = tmp_path / "kto.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [len(part) for part in load_examples(str(path))] == [4, 0]
    train_ex, held = load_examples(str(path), "dev")
    assert len(train_ex) == 4 and [e["completion"] for e in held] == ["c4", "c5"]
    assert build_config(KTOConfig, {"eval_split": "dev"}).eval_split == "dev"
