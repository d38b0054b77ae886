"""SFT trainer tests on a tiny random Llama: label masking, split invariance, training, saving."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.data.chat import IGNORE_INDEX, format_example
from rlhfkit.data.sft import collate, tokenize_examples
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.sft import ResponseNLL, SFTConfig, sft_gradients, train

from tiny_lm import build_tiny_model, build_tokenizer

EXAMPLES = [
    {"prompt": "Write a short review of the new cafe.", "response": "It was great, lovely coffee."},
    {"prompt": "What is 3 + 4?", "response": "The answer is 7."},
    {"prompt": "Continue this story about a lighthouse keeper.", "response": "At night the keeper sang."},
    {"prompt": "Hi", "response": "The film was terrible and boring. I hated the ending but loved the music."},
]


def _cfg(**kw) -> SFTConfig:
    base = dict(model="unused", dtype="fp32", tensorboard=False, quiet=True)
    base.update(kw)
    return build_config(SFTConfig, base)


def test_label_masking_prompt_tokens_carry_no_loss():
    """Only response tokens (and the closing eos) are scored; the loss equals cross-entropy with the
    prompt labelled -100, and no prompt position has a non-zero NLL."""
    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=2).eval()
    ex, dropped = tokenize_examples(tok, EXAMPLES[:2], _cfg(), 512)
    assert dropped == 0
    for e, raw in zip(ex, EXAMPLES[:2]):
        p_text, full = format_example(tok, raw["prompt"], raw["response"])
        n_prompt = len(tok(p_text, add_special_tokens=False)["input_ids"])
        assert e["labels"][:n_prompt] == [IGNORE_INDEX] * n_prompt  # every prompt token is masked
        assert IGNORE_INDEX not in e["labels"][n_prompt:]  # every response token is a target
        assert tok.decode(e["input_ids"][n_prompt:]) == raw["response"] + "<|im_end|>"
    batch = collate(ex, tok.pad_token_id)
    nll, mask = ResponseNLL(model)(**batch)
    n_resp = [sum(x != IGNORE_INDEX for x in e["labels"]) for e in ex]
    assert mask.sum(1).tolist() == n_resp
    assert (nll[~mask] == 0).all()
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    ref = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1),
                          ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(nll.sum() / mask.sum(), ref, atol=1e-5, rtol=1e-5)
    # Changing the prompt's label values cannot change the loss once they are -100; changing a
    # response label does.
    poked = {k: v.clone() for k, v in batch.items()}
    first_resp = int((poked["labels"][0] != IGNORE_INDEX).nonzero()[0])
    poked["labels"][0, first_resp] = (poked["labels"][0, first_resp] + 1) % len(tok)
    assert not torch.allclose(ResponseNLL(model)(**poked)[0].sum(), nll.sum())


class _Acc:
    """The few Accelerator methods sft_gradients uses, for one process."""

    device = torch.device("cpu")
    num_processes = 1

    def reduce(self, t, op):
        return t

    def backward(self, loss):
        loss.backward()


@pytest.mark.parametrize("micro, chunk", [(1, None), (2, None), (4, 1)])
def test_microbatch_split_gives_the_same_gradient(micro, chunk, monkeypatch):
    """The gradient one step accumulates. Examples have very different
    response lengths, so a per-micro-batch token mean would give a different gradient. chunk=1:
    the CPU's row chunks (`example_chunks`) cut the micro-batch of 4 into one example per chunk."""
    import rlhfkit.trainers.sft as sft_mod

    cuts = []
    real = sft_mod.example_chunks
    monkeypatch.setattr(sft_mod, "example_chunks", lambda m, d, b: cuts.append(len(real(m, d, b))) or real(m, d, b))
    tok = build_tokenizer()
    ex, _ = tokenize_examples(tok, EXAMPLES, _cfg(), 512)
    assert len({sum(x != IGNORE_INDEX for x in e["labels"]) for e in ex}) > 2

    def step(micro_batch_size, chunk=640):
        model = build_tiny_model(len(tok), seed=3)
        cfg = _cfg(batch_size=4, micro_batch_size=micro_batch_size, max_grad_norm=1e9, cpu_chunk_positions=chunk)
        m = sft_gradients(ResponseNLL(model), _Acc(), ex, tok.pad_token_id, cfg)
        return m, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    m_full, g_full = step(4)
    assert cuts == [1]  # a whole micro-batch: 4 short examples fit the default budget of 640 positions
    m_split, g_split = step(micro, chunk or 640)
    assert cuts[1:] == ([4] if chunk else [1] * (4 // micro))
    assert m_split["tokens"] == m_full["tokens"]
    assert math.isclose(m_split["loss/sft"], m_full["loss/sft"], rel_tol=1e-5)
    assert g_split.keys() == g_full.keys()
    for n in g_full:
        torch.testing.assert_close(g_split[n], g_full[n], atol=1e-6, rtol=1e-4)
    assert any(g.abs().sum() > 0 for g in g_full.values())


def test_train_lowers_eval_loss_and_saves_adapter_and_merged_model(tmp_path, tiny_model_dir):
    rows = [{**EXAMPLES[i % 4], "split": "train"} for i in range(16)] + [{**EXAMPLES[0], "split": "test"}]
    data = tmp_path / "sft.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = _cfg(model=str(tiny_model_dir), data=str(data), max_steps=12, batch_size=4, micro_batch_size=2,
               lr=5e-3, lora_dropout=0.0, warmup_steps=1, save_merged=True, output_dir=str(tmp_path / "runs"),
               run_name="s")
    summary = train(cfg)
    assert summary["train_examples"] == 16 and summary["eval_examples"] == 1
    assert summary["eval_after"]["loss"] < summary["eval_before"]["loss"] - 0.2
    run = tmp_path / "runs" / "s"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == list(range(12))
    last = metrics[-1]
    assert {"loss/sft", "eval/loss", "eval/perplexity", "params/grad_norm", "params/lr"} <= set(last)
    assert last["eval/perplexity"] == pytest.approx(math.exp(last["eval/loss"]), rel=1e-6)
    assert (run / "final" / "adapter_config.json").is_file() and (run / "final" / "tokenizer.json").is_file()
    # The merged model and the adapter (merged on load) reproduce the trained model's eval loss.
    from rlhfkit.models import load_causal_lm, load_tokenizer
    from rlhfkit.trainers.sft import mean_nll

    tok = load_tokenizer(str(run / "final"))
    held, _ = tokenize_examples(tok, [EXAMPLES[0]], cfg, 512)
    for path in (run / "final" / "merged", run / "final"):
        lm = load_causal_lm(str(path), trainable=False)
        loss, _ = mean_nll(ResponseNLL(lm), held, tok.pad_token_id, 2, "fp32", torch.device("cpu"))
        assert loss == pytest.approx(summary["eval_after"]["loss"], abs=1e-4), path
    # ROUGE before and after, in the summary and the last metrics row; the after figure is the ROUGE of
    # the final model's greedy response, recomputed here from the saved merged weights.
    from rlhfkit.commands.evaluate import rouge_scores
    from rlhfkit.rollout import SamplingParams
    from rlhfkit.rollout.texts import generate_texts

    for key in ("rouge_1", "rouge_2", "rouge_l"):
        assert 0.0 <= summary["eval_before"][key] <= 1.0 and last[f"eval/{key}"] == summary["eval_after"][key]
    lm = load_causal_lm(str(run / "final" / "merged"), trainable=False)
    prompt = format_example(tok, EXAMPLES[0]["prompt"], "")[0]
    text = generate_texts(lm, tok, [prompt], SamplingParams(cfg.rouge_max_new_tokens, 0.0, 0, 1.0,
                                                            (tok.eos_token_id,), None), 0)
    assert rouge_scores(text, [EXAMPLES[0]["response"]]) == pytest.approx(
        {k: summary["eval_after"][k] for k in ("rouge_1", "rouge_2", "rouge_l")}, abs=1e-9)


def test_plain_format_without_chat_template_and_chat_messages():
    tok = build_tokenizer()
    assert format_example(tok, "Hi there", "Hello.", chat_template=False) == (
        "User: Hi there\n\nAssistant: ", "User: Hi there\n\nAssistant: Hello.<|im_end|>")
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}, {"role": "user", "content": "Bye"}]
    p_text, full = format_example(tok, msgs, "Ciao")
    assert p_text.endswith("<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n") and full == p_text + "Ciao<|im_end|>"


def test_data_split_rules(tmp_path):
    from rlhfkit.data.sft import load_sft_examples
    from rlhfkit.data.splits import train_eval_split

    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(json.dumps({"prompt": f"q{i}", "response": f"a{i}"}) for i in range(20)))
    train_rows, held = train_eval_split(load_sft_examples, str(plain), None, 0.1, seed=0)
    assert len(train_rows) == 18 and len(held) == 2
    assert not {r["prompt"] for r in train_rows} & {r["prompt"] for r in held}
    again, _ = train_eval_split(load_sft_examples, str(plain), None, 0.1, seed=0)
    assert again == train_rows  # seeded
    tr, te = train_eval_split(load_sft_examples, "builtin:instructions", None, 0.1, seed=0)
    assert (len(tr), len(te)) == (156, 28)
    tagged = tmp_path / "tagged.jsonl"
    tagged.write_text("\n".join(json.dumps({"prompt": f"q{i}", "response": "a", "split": ["train", "test"][i % 2]})
                                for i in range(10)))
    tr, te = train_eval_split(load_sft_examples, str(tagged), None, 0.1, seed=0)
    assert [r["prompt"] for r in te] == ["q1", "q3", "q5", "q7", "q9"] and "split" not in tr[0]
    only_train = tmp_path / "only_train.jsonl"  # a split field but no test records: hold out a fraction
    only_train.write_text("\n".join(json.dumps({"prompt": f"q{i}", "response": "a", "split": "train"})
                                    for i in range(10)))
    tr, te = train_eval_split(load_sft_examples, str(only_train), None, 0.2, seed=0)
    assert (len(tr), len(te)) == (8, 2)


def test_config_errors_and_help(capsys):
    with pytest.raises(ConfigError, match=r"batch_size \(6\) must be divisible by micro_batch_size \(4\)"):
        _cfg(batch_size=6, micro_batch_size=4)
    with pytest.raises(ConfigError, match="did you mean 'max_steps'"):
        parse_args(SFTConfig, ["max_step=3"], "rlhfkit sft")
    assert parse_args(SFTConfig, ["--help"], "rlhfkit sft") is None
    out = capsys.readouterr().out
    for f in dataclasses.fields(SFTConfig):
        assert f"  {f.name} (" in out, f.name
