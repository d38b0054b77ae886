"""SFT as TRL's SFTTrainer does it: the text format, which tokens the loss covers, learning-rate
schedules and chat_template_path."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoTokenizer

from rlhfkit.core.config import build_config
from rlhfkit.data.chat import IGNORE_INDEX
from rlhfkit.data.sft import load_sft_examples, tokenize_examples
from rlhfkit.runtime.optim import make_optimizer
from rlhfkit.trainers.sft import train
from rlhfkit.trainers.sft_config import SFTConfig

from tiny_lm import build_tokenizer

CONV = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"}, {"role": "assistant", "content": "ciao"}]


def _cfg(**kw) -> SFTConfig:
    return build_config(SFTConfig, {"model": "unused", "dtype": "fp32", "tensorboard": False, "quiet": True, **kw})


def _trained_text(tok, example: dict, cfg) -> str:
    (t,), _ = tokenize_examples(tok, [example], cfg, 512)
    return tok.decode([i for i, label in zip(t["input_ids"], t["labels"]) if label != IGNORE_INDEX])


def test_text_records_train_every_token(tmp_path):
    (tmp_path / "t.jsonl").write_text(json.dumps({"text": "The film was great."}) + "\n")
    rows = load_sft_examples(str(tmp_path / "t.jsonl"))
    assert rows[0]["prompt"] == "" and rows[0]["text"] == "The film was great."
    tok = build_tokenizer()  # adds no BOS: every token is trained, the EOS that ends the text too
    (t,), _ = tokenize_examples(tok, rows, _cfg(), 512)
    assert t["labels"] == t["input_ids"]
    assert tok.decode(t["input_ids"]) == "The film was great.<|im_end|>"


@pytest.mark.parametrize(("options", "trained"), [
    ({"assistant_only_loss": True}, "hello<|im_end|>ciao<|im_end|>"),  # every assistant turn
    ({}, None),  # TRL's default for conversations: every token
])
def test_conversation_loss_covers_every_assistant_turn_or_everything(options, trained):
    tok = build_tokenizer()
    example = {"prompt": CONV[:-1], "response": "ciao", "messages": CONV}
    cfg = _cfg(**options)
    full = tok.apply_chat_template(CONV[:-1], tokenize=False, add_generation_prompt=True) + "ciao<|im_end|>"
    assert _trained_text(tok, example, cfg) == (full if trained is None else trained)
    # the plain format (no template) writes EOS only after the last turn: the earlier turn is its text
    plain = _trained_text(tok, example, _cfg(chat_template=False, **options))
    assert plain == ("hellociao<|im_end|>" if trained else "User: hi\n\nAssistant: hello\n\nUser: bye\n\nAssistant: ciao<|im_end|>")


def test_prompt_response_records_train_the_response_unless_asked():
    tok = build_tokenizer()
    example = {"prompt": "Say hi", "response": "hi"}
    assert _trained_text(tok, example, _cfg(chat_template=False)) == "hi<|im_end|>"
    assert _trained_text(tok, example, _cfg(chat_template=False, completion_only_loss=False)) == \
        "User: Say hi\n\nAssistant: hi<|im_end|>"


def _lrs(schedule: str, steps: int = 6) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(1))
    opt, sched = make_optimizer([p], lr=1.0, warmup_steps=2, schedule=schedule, total_steps=steps)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        p.grad = torch.zeros(1)
        opt.step()
        sched.step()
    return out


def test_schedules_golden():
    # warm-up W = 2 of T = 6 steps; transformers' warm-up runs at s / W, rlhfkit's constant at (s + 1) / W
    assert _lrs("constant") == pytest.approx([0.5, 1, 1, 1, 1, 1])
    assert _lrs("linear") == pytest.approx([0, 0.5, (6 - 2) / 4, (6 - 3) / 4, (6 - 4) / 4, (6 - 5) / 4])
    cosine = [0.5 * (1 + math.cos(math.pi * (s - 2) / 4)) for s in range(2, 6)]
    assert _lrs("cosine") == pytest.approx([0, 0.5, *cosine])


def test_sft_run_with_schedule_chat_template_path_and_every_assistant_turn(tmp_path, tiny_model_dir):
    template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}<|im_end|>{% endfor %}"
                "{% if add_generation_prompt %}[assistant] {% endif %}")
    (tmp_path / "t.jinja").write_text(template)
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"messages": CONV}) for _ in range(8)))
    cfg = _cfg(model=str(tiny_model_dir), data=str(tmp_path / "d.jsonl"), eval_fraction=0.25, max_steps=4,
               batch_size=2, micro_batch_size=2, warmup_steps=1, lr=1e-3, lr_scheduler_type="linear",
               chat_template_path=str(tmp_path / "t.jinja"), assistant_only_loss=True, rouge_examples=0,
               output_dir=str(tmp_path / "runs"), run_name="s")
    train(cfg)
    run = tmp_path / "runs" / "s"
    lrs = [json.loads(line)["params/lr"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    # logged after each step: linear warm-up W = 1 then decay over T = 4 steps: lr x (4 - s) / 3 at s = 1..4
    assert lrs == pytest.approx([1e-3 * (4 - s) / 3 for s in range(1, 5)], abs=1e-12)
    assert AutoTokenizer.from_pretrained(run / "final").chat_template == template


def test_packing_keeps_examples_apart_golden(tiny_model_dir):
    """A packed row's per-token NLL equals each example's NLL computed alone (positions restart,
    no attention across examples, no loss on an example's first token)."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.data.sft import collate, pack_examples
    from rlhfkit.trainers.sft import ResponseNLL

    tok = build_tokenizer()
    rows = [{"prompt": "", "text": t, "response": t} for t in ("The film was great.", "I hated it.", "Kind staff.")]
    examples, _ = tokenize_examples(tok, rows, _cfg(), 512)
    packed = pack_examples(examples, max_length=64)
    assert len(packed) == 1 and packed[0]["position_ids"][: len(examples[0]["input_ids"])] == list(
        range(len(examples[0]["input_ids"])))
    module = ResponseNLL(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval())
    with torch.no_grad():
        nll_packed, mask_packed = module(**collate(packed, tok.pad_token_id))
        alone = []
        for ex in sorted(examples, key=lambda e: -len(e["input_ids"])):  # the packing order
            nll, mask = module(**collate([ex], tok.pad_token_id))
            alone.append(nll[mask])
    want = torch.cat(alone)
    assert mask_packed.sum().item() == sum(len(e["input_ids"]) - 1 for e in examples)
    assert torch.allclose(nll_packed[mask_packed], want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    # first-fit by decreasing length: examples of 11, 9 and 8 tokens in rows of 20 -> [11 + 9, 8]
    assert [len(e["input_ids"]) for e in examples] == [11, 9, 8]
    assert [len(r["input_ids"]) for r in pack_examples(examples, max_length=20)] == [20, 8]


def test_sft_trains_on_packed_rows(tmp_path, tiny_model_dir, capsys):
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": f"Review {i}: it was great."}) for i in range(8)))
    summary = train(_cfg(model=str(tiny_model_dir), data=str(tmp_path / "d.jsonl"), eval_fraction=0.25, packing=True,
                         max_length=64, max_steps=1, batch_size=1, micro_batch_size=1, rouge_examples=0,
                         output_dir=str(tmp_path / "runs"), run_name="p"))
    assert "[sft] packed 6 examples into 2 rows of up to 64 tokens" in capsys.readouterr().out
    assert summary["eval_after"]["loss"] > 0
