"""Every common model family (tests/families.py) through every trainer for one step, and the
teacher-forced log-probs of each equal to generate's own scores (the ratio check's foundation).

Tiny random models, one step each: seconds per family on CPU.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from families import FAMILIES, save_family

from rlhfkit.core.config import build_config
from rlhfkit.data.chat import format_prompts
from rlhfkit.models import load_causal_lm, load_tokenizer
from rlhfkit.models.policy import ActorCritic
from rlhfkit.rollout import logprob_pass
from rlhfkit.rollout.core import rollout_from_tokens

PROMPTS = ["Hi", "Write a short review of the new cafe. It was great.", "What is 3 + 4?", "Hi",
           "The film was terrible and boring."]
GOOD = ["aa ee", "ee aa oo", "It was great, lovely coffee."]
BAD = ["th strct grd", "brr sh tkt", "The film was terrible."]
LENGTH = "def reward(prompts, completions, **kw):\n    return [float(len(c)) for c in completions]\n"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread for these tiny models: as fast on a quiet machine, and on a shared
    one far faster (a DPO step measured 0.4 s against 17.6 s with two threads spin-waiting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(Family, its saved model folder), built once per session."""
    fam = FAMILIES[request.param]
    return fam, save_family(fam, tmp_path_factory.mktemp(fam.name))


def _format(fam):
    """Prompt-format options as the trainers take them: the chat template where the tokenizer has
    one, and a system prompt where the family takes one."""
    return SimpleNamespace(chat_template=None, system_prompt=fam.system_prompt)


# ----------------------------------------------------------------------------- tokenizers and formats


def test_prompt_text_encodes_with_the_bos_the_tokenizer_adds(family):
    """A formatted prompt, encoded as rollouts and SFT encode it (no special tokens added), starts
    with exactly one BOS where the family's tokenizer adds one (Llama, Mistral, Gemma, OPT), whether
    the chat template writes it (Llama 3, Gemma 2) or the plain format is used; and with none where
    the tokenizer adds none (Qwen, Phi-3, GPT-2, GPT-NeoX)."""
    fam, path = family
    tok = load_tokenizer(str(path))
    assert tok.pad_token_id is not None  # GPT-2, GPT-NeoX, Llama, Mistral: eos stands in
    for text in format_prompts(tok, PROMPTS[:2], _format(fam)):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        n_bos = sum(1 for i in ids[:2] if i == tok.bos_token_id)
        if fam.add_bos:
            assert ids[0] == tok.bos_token_id and n_bos == 1, (fam.name, tok.convert_ids_to_tokens(ids[:3]))
        else:
            assert ids[0] != tok.bos_token_id, (fam.name, tok.convert_ids_to_tokens(ids[:3]))


# ----------------------------------------------------------------------------- log-probs vs generate


def _generate_and_score(fam, path, share_prefix: bool, share_prompts: bool, seed: int = 0):
    """(teacher-forced log-probs (B, R), generate's log-softmax scores at the sampled tokens (B, R),
    response mask (B, R), query mask (B, P)) for a batch of left-padded prompts."""
    from transformers import GenerationConfig

    model = load_causal_lm(str(path), trainable=False)
    tok = load_tokenizer(str(path))
    texts = format_prompts(tok, PROMPTS, _format(fam))
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    gen = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=8,
                           eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, output_scores=True,
                           return_dict_in_generate=True)
    torch.manual_seed(seed)
    out = model.generate(**enc, generation_config=gen)
    P = enc["input_ids"].shape[1]
    response = out.sequences[:, P:]
    expected = torch.stack([torch.log_softmax(s.float(), -1).gather(1, response[:, t : t + 1]).squeeze(1)
                            for t, s in enumerate(out.scores)], 1)  # (B, R)
    rollout = rollout_from_tokens(tok, enc, list(response), (tok.eos_token_id,))
    actor = ActorCritic(model, None, share_prompts=share_prompts, share_prefix=share_prefix)
    rollout = logprob_pass(actor, None, rollout, 1.0, micro_batch_size=len(PROMPTS))
    return rollout.logprobs, expected, rollout.response_mask.bool(), enc["attention_mask"]


@pytest.mark.parametrize("path_kind", ["plain", "share_prefix", "share_prompts"])
def test_teacher_forced_logprobs_equal_generate_scores(family, path_kind):
    """log pi(token) from one teacher-forced pass over prompt + response (left padding, prompts of
    different lengths) equals the log-softmax of generate's own per-step scores, through the plain
    pass and the shared-prefix / shared-prompt passes PPO and GRPO use."""
    fam, path = family
    lp, expected, mask, qmask = _generate_and_score(fam, path, path_kind == "share_prefix",
                                                    path_kind == "share_prompts")
    assert (qmask[:, 0] == 0).any() and qmask.sum(1).min() < qmask.sum(1).max()  # left padding in effect
    assert mask.sum() >= len(PROMPTS)
    got, want = lp[mask], expected[mask]
    assert torch.isfinite(want).all()
    scale = want.abs().mean().clamp(min=1.0)
    assert (got - want).abs().max() <= 1e-4 * scale, (fam.name, (got - want).abs().max().item())
    assert (lp[~mask] == 0).all()


def test_the_paths_under_test_are_taken(family):
    """The log-prob test above runs what it names: the shared prefix is used (a system prompt or a
    template header gives every prompt at least MIN_PREFIX common tokens) except where a sliding
    window narrower than the rows makes it unsafe, and a frozen Llama, Mistral or Qwen splits at
    its trunk (models/trunk.py), as a LoRA run's scoring pass does."""
    from rlhfkit.models.shared_prompts import shared_prefix_hidden, sliding_window_bites
    from rlhfkit.models.trunk import SPLITTABLE

    fam, path = family
    model = load_causal_lm(str(path), trainable=False)
    tok = load_tokenizer(str(path))
    enc = tok(format_prompts(tok, PROMPTS, _format(fam)), return_tensors="pt", padding=True, add_special_tokens=False)
    ids = torch.cat([enc["input_ids"], enc["input_ids"][:, -3:]], 1)
    mask = torch.cat([enc["attention_mask"], torch.ones(len(PROMPTS), 3, dtype=torch.long)], 1)
    bites = sliding_window_bites(model.config, ids.shape[1])
    assert bites == ("sliding_window" in fam.features)
    with torch.no_grad():
        hidden = shared_prefix_hidden(model.get_decoder(), ids, mask, 3)
    assert (hidden is None) == bites
    assert ActorCritic(model, None).trunk_depth == (1 if model.config.model_type in SPLITTABLE else 0)


@pytest.mark.parametrize("family", sorted(n for n, f in FAMILIES.items() if f.features), indirect=True)
def test_family_features_bite_at_test_lengths(family):
    """The tiny configs exercise what they claim: with the sliding window widened, or the soft-caps
    removed, the next-token log-probs of the test prompts change (so the tests above would catch a
    log-prob path that ignored them)."""
    from transformers import AutoModelForCausalLM

    fam, path = family
    tok = load_tokenizer(str(path))
    enc = tok(format_prompts(tok, PROMPTS, _format(fam)), return_tensors="pt", padding=True,
              add_special_tokens=False)

    def logp(**override):
        model = AutoModelForCausalLM.from_pretrained(path, **override).eval()
        with torch.no_grad():
            return torch.log_softmax(model(**enc).logits[:, -1].float(), -1)

    base = logp()
    for feature in fam.features:
        override = ({"sliding_window": 1000} if feature == "sliding_window"
                    else {"final_logit_softcapping": None, "attn_logit_softcapping": None})
        assert (logp(**override) - base).abs().max() > 1e-3 * base.abs().mean(), (fam.name, feature)


def test_sft_and_reward_model_see_what_the_model_computes(family):
    """SFT's per-token NLL (decoder + output layer, labelled positions only) equals the cross-entropy
    of the model's own logits (soft-capped on Gemma 2, projected on OPT), and the reward model's
    backbone gives the causal LM's final hidden states at the scored (last real) token."""
    import torch.nn.functional as F
    from transformers import AutoModel

    from rlhfkit.data.chat import format_example
    from rlhfkit.data.sft import collate, tokenize_examples
    from rlhfkit.models.trunk import position_ids_from_mask
    from rlhfkit.trainers.sft import ResponseNLL

    fam, path = family
    model = load_causal_lm(str(path), trainable=False)
    tok = load_tokenizer(str(path))
    rows = [{"prompt": p, "response": r} for p, r in zip(PROMPTS[:3], GOOD)]
    examples, dropped = tokenize_examples(tok, rows, _format(fam), 512)
    assert dropped == 0
    batch = collate(examples, tok.pad_token_id)  # right padding
    nll, mask = ResponseNLL(model)(**batch)
    pos = position_ids_from_mask(batch["attention_mask"])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=pos).logits
    want = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], reduction="none")  # (B, L-1)
    assert mask.sum() > 0
    torch.testing.assert_close(nll[mask], want[mask], rtol=1e-5, atol=1e-5 * float(want[mask].abs().mean()))
    # the reward model's backbone, as `rlhfkit rm` loads it, at the last real token of left-padded texts
    texts = [format_example(tok, r["prompt"], r["response"], None, fam.system_prompt)[1] for r in rows]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)  # left padding
    last = enc["attention_mask"].shape[1] - 1
    backbone = AutoModel.from_pretrained(path).eval()
    with torch.no_grad():
        h = backbone(**enc, position_ids=position_ids_from_mask(enc["attention_mask"])).last_hidden_state[:, last]
        full = model(**enc, position_ids=position_ids_from_mask(enc["attention_mask"]),
                     output_hidden_states=True).hidden_states[-1][:, last]
    torch.testing.assert_close(h, full, rtol=1e-5, atol=1e-5 * float(full.abs().mean()))


# ----------------------------------------------------------------------------- one step of each trainer


def _write_inputs(tmp_path):
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({"prompt": PROMPTS[i % 5], "chosen": GOOD[i % 3], "rejected": BAD[i % 3],
                                         "response": GOOD[i % 3]}) + "\n" for i in range(8)))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS[1:]))
    reward = tmp_path / "length.py"
    reward.write_text(LENGTH)
    return prefs, prompts, reward


def _config(trainer: str, fam, path, tmp_path):
    from rlhfkit.trainers.dpo_config import DPOConfig
    from rlhfkit.trainers.grpo_config import GRPOConfig
    from rlhfkit.trainers.ppo_config import PPOConfig
    from rlhfkit.trainers.rm_config import RMConfig
    from rlhfkit.trainers.sft_config import SFTConfig

    prefs, prompts, reward = _write_inputs(tmp_path)
    common = dict(model=str(path), dtype="fp32", output_dir=str(tmp_path / "runs"), run_name=trainer, quiet=True,
                  tensorboard=False, lr=1e-2, warmup_steps=1, lora_r=4, lora_alpha=8, lora_dropout=0.0,
                  system_prompt=fam.system_prompt)
    rl = dict(prompts=str(prompts), reward=f"python:{reward}:reward", iterations=1, max_new_tokens=6,
              num_eval_prompts=0, log_samples=0)
    cls, kw = {
        "sft": (SFTConfig, dict(data=str(prefs), eval_fraction=0.0, max_steps=1, batch_size=4, micro_batch_size=2,
                                rouge_examples=0)),
        "rm": (RMConfig, dict(data=str(prefs), eval_fraction=0.0, max_steps=1, batch_size=4, micro_batch_size=2,
                              stats_pairs=4)),
        "dpo": (DPOConfig, dict(prefs=str(prefs), max_steps=1, batch_size=4, micro_batch_size=2, num_eval_prompts=0)),
        "ppo": (PPOConfig, dict(rl, rollout_batch_size=4, mini_batch_size=4, micro_batch_size=2, ppo_epochs=1)),
        "grpo": (GRPOConfig, dict(rl, rollout_batch_size=4, group_size=2, mini_batch_size=4, micro_batch_size=2,
                                  update_epochs=1, drop_zero_std_groups=False)),
    }[trainer]
    return build_config(cls, {**common, **kw})


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().clone() for k, v in model.state_dict().items()}


def _trained_weights(trainer: str, final):
    """The trained network (adapter merged on its base) as it loads back from RUN/final."""
    if trainer == "rm":
        from rlhfkit.models.reward_model import load_reward_model

        model, _, _ = load_reward_model(final)
        return model.backbone
    return load_causal_lm(str(final), trainable=False)


@pytest.mark.parametrize("trainer", ["sft", "rm", "dpo", "ppo", "grpo"])
def test_one_step_of_each_trainer(family, trainer, tmp_path):
    """One optimiser step (one iteration) on the family: finite losses logged, and the saved result
    loads back as the family's own class with weights moved away from the starting ones."""
    from importlib import import_module

    fam, path = family
    train = import_module(f"rlhfkit.trainers.{trainer}").train
    train(_config(trainer, fam, path, tmp_path))
    run = tmp_path / "runs" / trainer
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 1
    losses = {k: v for k, v in rows[0].items() if k.startswith("loss/")}
    assert losses and all(math.isfinite(v) for v in losses.values()), losses
    if trainer == "rm":  # the backbone alone, as AutoModel loads it
        from transformers import AutoModel

        start = AutoModel.from_pretrained(path)
    else:
        start = load_causal_lm(str(path), trainable=False)
    trained = _trained_weights(trainer, run / "final")
    assert type(trained) is type(start), (type(trained), type(start))
    before, after = _state(start), _state(trained)
    assert before.keys() == after.keys()
    assert all(torch.isfinite(v).all() for v in after.values())
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert moved, f"{fam.name}/{trainer}: no weight changed"
