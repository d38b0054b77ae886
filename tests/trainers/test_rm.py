"""Reward model tests on tiny models: last-token scores, Bradley-Terry training, saving, model:PATH."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError, UserError
from rlhfkit.models.reward_model import (
    RewardModel,
    ScoreHead,
    add_backbone_lora,
    encode_texts,
    load_reward_scorer,
    normalise,
)
from rlhfkit.trainers.rm import RMConfig, train

from tiny_lm import build_tiny_model, build_tokenizer


@pytest.fixture()
def tiny_rm():
    tok = build_tokenizer()
    lm = build_tiny_model(len(tok), seed=4)
    torch.manual_seed(0)
    return RewardModel(lm.get_decoder(), ScoreHead(32), causal=True).eval(), tok


def test_last_token_score_left_and_right_padding_with_pad_equal_to_eos(tiny_rm):
    """The score is read at the last attended position. The chat text contains eos (== pad == 2)
    after every turn, so 'first pad token' would read inside the prompt, and 'last token != pad'
    would skip the final eos; both must differ from the right answer."""
    model, tok = tiny_rm
    msgs = [{"role": "user", "content": "Write a short review of the new cafe."}]
    texts = [tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) + r + "<|im_end|>"
             for r in ("It was great.", "Terrible coffee and boring staff, I hated it.", "Ok")]
    with torch.no_grad():
        alone = []
        for t in texts:  # unpadded: the score of the final token (the closing eos)
            ids = tok(t, return_tensors="pt", add_special_tokens=False)["input_ids"]
            assert ids[0, -1].item() == tok.pad_token_id == tok.eos_token_id == 2
            alone.append(model(ids, torch.ones_like(ids)).item())
            h = model.backbone(input_ids=ids).last_hidden_state[0]  # (L, H)
            first_eos = int((ids[0] == 2).nonzero()[0])
            last_non_pad = int((ids[0] != 2).nonzero()[-1])
            assert first_eos < ids.shape[1] - 1 and last_non_pad < ids.shape[1] - 1
            wrong = {model.head(h[first_eos]).item(), model.head(h[last_non_pad]).item()}
            assert all(abs(w - alone[-1]) > 1e-4 for w in wrong)
        for side in ("left", "right"):
            tok.padding_side = side
            enc = encode_texts(tok, texts, 512, add_special_tokens=False)
            assert (enc["attention_mask"] == 0).any(), "the batch must contain padding"
            batched = model(enc["input_ids"], enc["attention_mask"]).tolist()
            assert batched == pytest.approx(alone, abs=1e-5), side


def test_mean_pooling_ignores_padding(tiny_rm):
    model, tok = tiny_rm
    model.pooling = "mean"
    tok.padding_side = "right"
    enc = encode_texts(tok, ["Hi", "What is 3 + 4? The answer is 7."], 512, add_special_tokens=False)
    with torch.no_grad():
        batched = model(enc["input_ids"], enc["attention_mask"])
        ids = tok("Hi", return_tensors="pt", add_special_tokens=False)["input_ids"]
        alone = model(ids, torch.ones_like(ids))
    torch.testing.assert_close(batched[0], alone[0], atol=1e-5, rtol=1e-5)


def test_lora_reward_model_trains_adapters_and_head_only(tiny_rm):
    """docs/pitfalls.md#lora-reference: with LoRA the score head must be trained too (and the base must stay frozen)."""
    from rlhfkit.trainers.rm import make_rm_optimizer

    model, tok = tiny_rm
    model.backbone = add_backbone_lora(model.backbone, 4, 8, 0.0, None)
    cfg = build_config(RMConfig, {"data": "x.jsonl", "lr": 1e-2, "warmup_steps": 1})
    opt, _ = make_rm_optimizer(model, cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    enc = encode_texts(tok, ["good good", "bad"], 64, False)
    s = model.train()(enc["input_ids"], enc["attention_mask"])
    (-(s[0] - s[1])).backward()
    opt.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert any(n.startswith("head.") for n in changed), "score head not trained"
    assert any("lora_" in n for n in changed)
    assert all("lora_" in n or n.startswith("head.") for n in changed), sorted(changed)[:3]
    # lora_layers=1: adapters only in the top layer (of 2)
    top = add_backbone_lora(build_tiny_model(len(tok), seed=4).get_decoder(), 4, 8, 0.0, None, last_layers=1)
    lora = [n for n, p in top.named_parameters() if p.requires_grad]
    assert lora and all(".layers.1." in n for n in lora)


def _toy_pairs(path, n=24):
    """Separable: chosen replies are positive, rejected ones negative, prompts shared."""
    good = ["It was great, lovely coffee.", "Kind staff and great music.", "I loved the film."]
    bad = ["The film was terrible.", "Boring and I hated it.", "Terrible, boring ending."]
    rows = [{"prompt": f"Write a short review of thing {i}.", "chosen": good[i % 3], "rejected": bad[(i + 1) % 3],
             "split": "test" if i >= n - 6 else "train"} for i in range(n)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return rows


def test_bradley_terry_reaches_accuracy_one_and_scorer_matches(tmp_path, tiny_model_dir):
    rows = _toy_pairs(tmp_path / "prefs.jsonl")
    cfg = build_config(RMConfig, dict(
        model=str(tiny_model_dir), data=str(tmp_path / "prefs.jsonl"), dtype="fp32", lora=False, lr=3e-3,
        warmup_steps=1, max_steps=25, batch_size=8, micro_batch_size=4, output_dir=str(tmp_path / "runs"),
        run_name="rm", quiet=True, tensorboard=False, normalize="center"))
    summary = train(cfg)
    assert summary["train_pairs"] == 18 and summary["eval_pairs"] == 6
    assert summary["eval_before"]["accuracy"] < 1.0
    metrics = [json.loads(line) for line in (tmp_path / "runs" / "rm" / "metrics.jsonl").read_text().splitlines()]
    for key in ("loss/rm", "rm/accuracy", "rm/margin", "rm/chosen_mean", "rm/rejected_mean"):
        assert key in metrics[-1], key
    assert metrics[-1]["rm/accuracy"] == 1.0 and summary["eval_after"]["accuracy"] == 1.0
    assert metrics[-1]["loss/rm"] < metrics[0]["loss/rm"]
    # The saved model, as a reward function: same format, scores, and centring as in training.
    final = tmp_path / "runs" / "rm" / "final"
    meta = json.loads((final / "rlhfkit_rm.json").read_text())
    assert {"score_mean", "score_std", "normalize", "chat_template", "max_length", "base_model"} <= set(meta)
    scorer = load_reward_scorer(str(final))
    train_rows = [r for r in rows if r["split"] == "train"]
    prompts = [r["prompt"] for r in train_rows] * 2
    comps = [r["chosen"] for r in train_rows] + [r["rejected"] for r in train_rows]
    scores = scorer(prompts, comps)
    raw = scorer.raw_scores(prompts, comps)
    assert scores == pytest.approx([s - meta["score_mean"] for s in raw], abs=1e-6)
    assert sum(scores) / len(scores) == pytest.approx(0.0, abs=1e-4)  # centred on the training responses
    assert all(c > r for c, r in zip(scores[:18], scores[18:]))
    from rlhfkit.rewards import get_reward, score_batch

    via_spec = score_batch(get_reward(f"model:{final}"), prompts[:3], comps[:3])
    assert via_spec == pytest.approx(scores[:3], abs=1e-5)


def test_lora_reward_model_saves_adapter_and_reloads(tmp_path, tiny_model_dir):
    _toy_pairs(tmp_path / "prefs.jsonl", n=12)
    cfg = build_config(RMConfig, dict(
        model=str(tiny_model_dir), data=str(tmp_path / "prefs.jsonl"), dtype="fp32", lora=True, lora_r=4,
        lr=1e-2, max_steps=3, batch_size=4, micro_batch_size=2, output_dir=str(tmp_path / "runs"), run_name="rm",
        quiet=True, tensorboard=False, normalize="standardize"))
    summary = train(cfg)
    final = tmp_path / "runs" / "rm" / "final"
    # final/ is the standard sequence classifier; the adapter + head lie in final/rlhfkit_rm
    assert (final / "config.json").is_file() and not (final / "adapter_config.json").exists()
    assert (final / "rlhfkit_rm" / "adapter_config.json").is_file()
    assert not (final / "rlhfkit_rm" / "config.json").exists()
    scorer = load_reward_scorer(str(final))
    eval_rows = [json.loads(line) for line in (tmp_path / "prefs.jsonl").read_text().splitlines()][-6:]
    raw = scorer.raw_scores([r["prompt"] for r in eval_rows], [r["chosen"] for r in eval_rows])
    ev = summary["eval_after"]
    assert sum(raw) / len(raw) == pytest.approx(ev["chosen_mean"], abs=1e-4)  # same scores after reload
    m, s = summary["score_stats"]["mean"], summary["score_stats"]["std"]
    assert scorer([r["prompt"] for r in eval_rows], [r["chosen"] for r in eval_rows]) == pytest.approx(
        normalise(raw, "standardize", m, s))


def test_normalise_golden():
    assert normalise([1.0, 3.0], "none", 2.0, 0.5) == [1.0, 3.0]
    assert normalise([1.0, 3.0], "center", 2.0, 0.5) == [-1.0, 1.0]
    assert normalise([1.0, 3.0], "standardize", 2.0, 0.5) == [-2.0, 2.0]


def test_margin_enters_the_loss(tmp_path):
    from rlhfkit.trainers.rm import pair_margins

    cfg = build_config(RMConfig, {"data": "x.jsonl", "margin": 0.5})
    assert pair_margins([{"margin": 2.0}, {}], cfg, torch.device("cpu")).tolist() == [2.0, 0.5]
    cfg = build_config(RMConfig, {"data": "x.jsonl", "use_data_margin": False})
    assert pair_margins([{"margin": 2.0}], cfg, torch.device("cpu")) is None


def test_encoder_backbone(tmp_path):
    """A small BERT-style encoder works as a backbone: right padding, mean pooling, its own specials."""
    from transformers import BertConfig, BertModel

    tok = build_tokenizer()
    enc_dir = tmp_path / "bert"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, pad_token_id=2)).save_pretrained(enc_dir)
    tok.save_pretrained(enc_dir)
    _toy_pairs(tmp_path / "prefs.jsonl", n=8)
    cfg = build_config(RMConfig, dict(model=str(enc_dir), data=str(tmp_path / "prefs.jsonl"), dtype="fp32",
                                      lora=False, max_steps=2, batch_size=4, micro_batch_size=4,
                                      output_dir=str(tmp_path / "runs"), run_name="rm", quiet=True,
                                      tensorboard=False))
    train(cfg)
    meta = json.loads((tmp_path / "runs" / "rm" / "final" / "rlhfkit_rm.json").read_text())
    assert (meta["causal"], meta["pooling"], meta["padding_side"]) == (False, "mean", "right")
    s = load_reward_scorer(str(tmp_path / "runs" / "rm" / "final"))(["a", "b"], ["good", "bad one"])
    assert len(s) == 2 and s[0] != s[1]


def test_errors_and_help(tmp_path, capsys):
    with pytest.raises(ConfigError, match="data: give a preference file"):
        build_config(RMConfig, {})
    with pytest.raises(ConfigError, match=r"batch_size \(10\) must be divisible by micro_batch_size \(4\)"):
        build_config(RMConfig, {"data": "x", "batch_size": 10, "micro_batch_size": 4})
    with pytest.raises(UserError, match="not a reward model folder"):
        load_reward_scorer(str(tmp_path))
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": "a", "chosen": "x", "rejected": "y"}\n{"prompt": "b", "chosen": "x"}\n')
    with pytest.raises(UserError, match=r"p.jsonl:2: missing field 'rejected'"):
        train(build_config(RMConfig, {"data": str(bad), "model": "nowhere", "output_dir": str(tmp_path)}))
    assert parse_args(RMConfig, ["--help"], "rlhfkit rm") is None
    out = capsys.readouterr().out
    for f in dataclasses.fields(RMConfig):
        assert f"  {f.name} (" in out, f.name


def test_builtin_prefs_reviews_is_accepted_with_its_own_splits(tmp_path, tiny_model_dir):
    """`rlhfkit rm data=builtin:prefs_reviews` trains on the pairs DPO's demo uses, split by their split field."""
    from rlhfkit.trainers.dpo import resolve_prefs

    rows = [json.loads(line) for line in open(resolve_prefs("builtin:prefs_reviews"))]
    n_test = sum(r.get("split") == "test" for r in rows)
    assert 0 < n_test < len(rows)
    cfg = build_config(RMConfig, dict(
        model=str(tiny_model_dir), data="builtin:prefs_reviews", dtype="fp32", lora=False, max_steps=1, batch_size=4,
        micro_batch_size=4, max_eval_pairs=8, output_dir=str(tmp_path / "runs"), run_name="rm", quiet=True,
        tensorboard=False))
    summary = train(cfg)
    assert summary["train_pairs"] == len(rows) - n_test
    assert summary["eval_pairs"] == min(8, n_test)


def rm_step_gradient(model_dir, micro: int) -> torch.Tensor:
    """The gradient `rm_gradients` accumulates over a short batch (an epoch's last: 6 pairs of batch_size 8) cut
    into micro-batches of `micro` pairs."""
    from accelerate import Accelerator

    from rlhfkit.trainers.rm import build_reward_model, rm_gradients

    cfg = build_config(RMConfig, {"model": str(model_dir), "data": "unused", "dtype": "fp32", "batch_size": 8,
                                  "micro_batch_size": micro, "lora_r": 4, "max_grad_norm": 1e9, "center_coef": 0.1})
    torch.manual_seed(0)
    model, tok, info = build_reward_model(cfg)
    pairs = [{"prompt": f"Write a review of thing number {i}.", "chosen": ["aa ee", "oo aa ee ii", "ee"][i % 3],
              "rejected": ["th strct grd", "brr", "xyz rhythm grr psst"][i % 3]} for i in range(6)]
    rm_gradients(model, Accelerator(cpu=True), tok, pairs, info, cfg, len(pairs) / cfg.batch_size)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad and p.grad is not None])


@pytest.mark.parametrize("micro", [2, 4])  # 2 + 2 + 2 pairs; 4 + 2
def test_the_step_gradient_does_not_depend_on_the_micro_batch_split(tiny_model_dir, micro):
    """Each micro-batch's mean pair loss is weighted by its pairs / batch_size, so the gradient is
    that of the step's summed pair loss / batch_size however the pairs are cut."""
    whole, split = rm_step_gradient(tiny_model_dir, 8), rm_step_gradient(tiny_model_dir, micro)
    assert whole.norm() > 0
    assert (split - whole).norm() <= 1e-5 * whole.norm()
