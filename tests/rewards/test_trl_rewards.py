"""Rewards the way TRL takes them: keyword calls, message lists for conversational data, several
rewards with weights, and standard sequence-classification reward models."""

from __future__ import annotations

import json

import pytest
import torch

from rlhfkit.core.config import build_config
from rlhfkit.errors import UserError
from rlhfkit.rewards import check_reward_call, get_rewards, score_batch, score_parts
from rlhfkit.rewards.scoring import RewardError, takes_keywords
from rlhfkit.trainers.grpo import train as grpo_train
from rlhfkit.trainers.grpo_config import GRPOConfig


def trl_reward(completions, **kwargs):  # TRL's documented form
    return [float(len(c)) + kwargs["bonus"][i] for i, c in enumerate(completions)]


def positional_reward(p, c, **info):  # rlhfkit's form: any parameter names, positional
    return [float(len(x)) for x in c]


def test_call_style_from_the_signature():
    assert takes_keywords(trl_reward) and takes_keywords(lambda **kw: kw)
    assert takes_keywords(lambda prompts, completions, answer, **kw: 0)
    assert not takes_keywords(positional_reward) and not takes_keywords(lambda a, b: 0)


def test_keyword_call_gets_prompts_and_columns_as_keywords():
    seen = {}

    def reward(prompts, completions, answer, **kwargs):
        seen.update(prompts=prompts, answer=answer, rest=sorted(kwargs))
        return [1.0] * len(completions)

    assert score_batch(reward, ["p1", "p2"], ["a", "bb"], {"answer": [3, 4], "level": [1, 2]}) == [1.0, 1.0]
    assert seen == {"prompts": ["p1", "p2"], "answer": [3, 4], "rest": ["level"]}
    assert score_batch(trl_reward, ["p", "q"], ["ab", "c"], {"bonus": [0.5, 1.0]}) == [2.5, 2.0]
    assert score_batch(positional_reward, ["p"], ["abc"], {"x": [1]}) == [3.0]
    # through a python: spec (a wrapper that must keep the function's own signature)
    assert takes_keywords(get_rewards(f"python:{__name__}:trl_reward"))


def test_signature_checked_against_the_columns():
    check_reward_call(trl_reward, ["bonus"])
    with pytest.raises(RewardError, match=r"reward 'needs_solution' needs the column 'solution', which the data lacks "
                                          r"\(its columns: answer\).*\(and add \*\*kwargs"):
        def needs_solution(completions, solution):
            return [0.0] * len(completions)
        check_reward_call(needs_solution, ["answer"])


def test_a_bad_signature_stops_before_the_model_loads(tmp_path):
    """The model does not exist: the reward's error must come first (it came 41 s in, after a rollout)."""
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi", "answer": 1}\n')
    (tmp_path / "bad.py").write_text("def reward(completions, solution):\n    return [0.0] * len(completions)\n")
    cfg = build_config(GRPOConfig, {"model": str(tmp_path / "no-model"), "prompts": str(tmp_path / "p.jsonl"),
                                    "reward": f"python:{tmp_path / 'bad.py'}:reward", "num_eval_prompts": 0,
                                    "output_dir": str(tmp_path / "runs")})
    with pytest.raises(RewardError, match="needs the column 'solution', which the data lacks"):
        grpo_train(cfg)
    assert not (tmp_path / "runs").exists()


def test_weighted_rewards_golden():
    # length:N = -min(1, |words - N| / N); "a b c d" has 4 words
    fn = get_rewards("length:2,length:4", [1.0, 0.5])
    total, parts = score_parts(fn, ["p"], ["a b c d"])
    assert parts == {"length:2": [-1.0], "length:4": [0.0]}
    assert total == [1.0 * -1.0 + 0.5 * 0.0]
    assert score_batch(fn, ["p"], ["a b c"]) == pytest.approx([1.0 * -0.5 + 0.5 * -0.25])
    assert get_rewards([trl_reward, trl_reward]).reward_name == "1 x trl_reward + 1 x trl_reward#2"
    with pytest.raises(UserError, match=r"reward_weights has 1 values for 2 rewards \(length:2, length:4\)"):
        get_rewards("length:2,length:4", [1.0])


VOWELS = ("def reward(completions, **kw):  # TRL's conversational form: completion[0]['content']\n"
          "    return [float(sum(ch in 'aeiou' for ch in c[0]['content'])) for c in completions]\n")
SEEN = "import json\ndef reward(prompts, completions, **kw):\n    open(%r, 'a').write(json.dumps([prompts[0], completions[0]]) + '\\n')\n    return [0.0] * len(completions)\n"


def _tiny(tmp_path, tiny_model_dir, prompts_file, **kw):
    base = dict(model=str(tiny_model_dir), prompts=str(prompts_file), iterations=1, rollout_batch_size=4,
                group_size=2, mini_batch_size=4, micro_batch_size=2, max_new_tokens=4, num_eval_prompts=0,
                dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="t", quiet=True, tensorboard=False)
    return build_config(GRPOConfig, {**base, **kw})


def test_several_rewards_each_logged_and_conversational_messages(tmp_path, tiny_model_dir):
    (tmp_path / "vowels.py").write_text(VOWELS)
    (tmp_path / "seen.py").write_text(SEEN % str(tmp_path / "seen.jsonl"))
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps({"prompt": chat}) for _ in range(4)))
    cfg = _tiny(tmp_path, tiny_model_dir, tmp_path / "p.jsonl", reward_weights=[2.0, 1.0],
                reward=f"python:{tmp_path / 'vowels.py'}:reward,python:{tmp_path / 'seen.py'}:reward")
    grpo_train(cfg)
    row = json.loads((tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()[0])
    vowels = row[f"reward/python:{tmp_path / 'vowels.py'}:reward"]
    assert row[f"reward/python:{tmp_path / 'seen.py'}:reward"] == 0.0
    assert row["rollout/score_mean"] == pytest.approx(2.0 * vowels, rel=1e-6, abs=1e-6)
    prompt, completion = json.loads((tmp_path / "seen.jsonl").read_text().splitlines()[0])
    assert prompt == chat  # the conversation, as TRL passes it
    assert isinstance(completion, list) and completion[0]["role"] == "assistant"


def _tiny_classifier(tmp_path, tiny_tokenizer):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1, pad_token_id=0)
    model = LlamaForSequenceClassification(config).eval()
    folder = tmp_path / "hub-rm"
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return model, folder


def test_any_sequence_classification_folder_is_a_reward(tmp_path, tiny_tokenizer):
    model, folder = _tiny_classifier(tmp_path, tiny_tokenizer)
    reward = get_rewards(f"model:{folder}")
    prompts, completions = ["Write a review.", "What is 3 + 4?"], ["It was great.", "The answer is 7, I think"]
    got = score_batch(reward, prompts, completions)
    # by hand: the chat-formatted text, one at a time (no padding), logit 0 at the last token
    want = []
    for p, c in zip(prompts, completions):
        text = tiny_tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                  add_generation_prompt=True) + c + "<|im_end|>"
        ids = tiny_tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        want.append(model(input_ids=ids).logits[0, 0].item())
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5 * max(abs(w) for w in want))
    # conversational completions are read as their text
    assert score_batch(reward, prompts[:1], [[{"role": "assistant", "content": completions[0]}]]) == \
        pytest.approx(got[:1], rel=1e-5)


def test_rm_writes_a_standard_copy_that_scores_the_same(tmp_path, tiny_model_dir):
    from rlhfkit.models.reward_model import load_reward_scorer
    from rlhfkit.trainers.rm import RMConfig
    from rlhfkit.trainers.rm import train as rm_train

    rows = [{"prompt": f"Review {i}.", "chosen": "It was great.", "rejected": "Terrible."} for i in range(8)]
    (tmp_path / "prefs.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    summary = rm_train(build_config(RMConfig, dict(
        model=str(tiny_model_dir), data=str(tmp_path / "prefs.jsonl"), dtype="fp32", lora=True, lora_r=4, lr=1e-2,
        max_steps=2, batch_size=4, micro_batch_size=4, output_dir=str(tmp_path / "runs"), run_name="rm", quiet=True,
        tensorboard=False)))
    final = tmp_path / "runs" / "rm" / "final"
    assert summary["sequence_classification"] == str(final)
    ours = load_reward_scorer(str(final))
    standard = get_rewards(f"model:{final / 'rlhfkit_rm'}")  # the rlhfkit form alone scores as final/ does
    assert score_batch(standard, ["Review 1."], ["It was great."]) == pytest.approx(
        score_batch(ours, ["Review 1."], ["It was great."]), rel=1e-6)
    from rlhfkit.models.classifier_reward import load_classifier_scorer

    standard = load_classifier_scorer(final)  # final/ itself as a plain sequence classifier
    prompts, comps = ["Review 1.", "Review 2 please."], ["It was great.", "Terrible, boring and long."]
    bias = ours.model.head.linear.bias.item()  # the standard `score` layer has none: a constant offset
    raw = [s - bias for s in ours.raw_scores(prompts, comps)]
    assert score_batch(standard, prompts, comps) == pytest.approx(raw, rel=1e-4, abs=1e-4 * max(map(abs, raw)))
    # `rlhfkit export` takes the reward-model run: plain transformers loads it and scores the same
    from transformers import AutoModelForSequenceClassification

    from rlhfkit.commands.export import export_run

    out = export_run(tmp_path / "runs" / "rm", tmp_path / "exported")
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    scorer = standard
    with torch.no_grad():
        plain = [model(**scorer.tok(t, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()
                 for t in scorer.texts(prompts, comps)]
    assert plain == pytest.approx(raw, rel=1e-4, abs=1e-4 * max(map(abs, raw)))
    # RUN/final itself loads in plain transformers with its trained head (no weight missing), batched
    from transformers import AutoTokenizer

    loaded, report = AutoModelForSequenceClassification.from_pretrained(final, output_loading_info=True)
    assert not report["missing_keys"], report
    tok = AutoTokenizer.from_pretrained(final)
    texts = scorer.texts(prompts, comps)
    with torch.no_grad():
        batched = loaded.eval()(**tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)).logits[:, 0]
    assert batched.tolist() == pytest.approx(raw, rel=1e-4, abs=1e-4 * max(map(abs, raw)))
    assert not (out / "rlhfkit_rm").exists() and not (out / "rlhfkit_rm.json").exists()  # export: the standard form
    card = (out / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "A reward model trained with **rm**" in card
