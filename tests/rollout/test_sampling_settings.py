"""Rollouts sample from the policy and nothing else: the model folder's generation_config.json
(repetition penalty, minimum length, banned tokens, forced BOS/EOS, its own top-k/top-p/min-p, ...)
must not reach the sampler, or the stored log-probs (the plain policy's) describe another
distribution. `rlhfkit generate --model-generation-config` still offers those settings on request.

The tiny model's final norm is scaled up so that its next-token distribution is far from uniform
(the most likely first token, the prompt's own last token, has p ~ 0.3), which makes every one of
those settings visible in the samples.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from rlhfkit.models import load_causal_lm, load_tokenizer
from rlhfkit.rollout import SamplingParams, generate

from tiny_lm import build_tiny_model, build_tokenizer

PROMPT = "Write a short review of the new cafe."
T = 0.8


def first_step_logits(model, tok, prompt: str = PROMPT) -> torch.Tensor:
    """The policy's raw next-token logits (V,) after `prompt`."""
    enc = tok([prompt], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return model(**enc).logits[0, -1].float()


def model_settings(ranked: list[int]) -> dict:
    """A generation_config.json that sets every field that changes what is sampled. `ranked`: token
    ids from most to least likely after PROMPT (the banned ones are likely ones, so a leak shows)."""
    return {
        "do_sample": True, "temperature": 0.3, "top_k": 5, "top_p": 0.5, "min_p": 0.2, "typical_p": 0.5,
        "epsilon_cutoff": 0.01, "repetition_penalty": 5.0, "no_repeat_ngram_size": 1, "min_new_tokens": 6,
        "suppress_tokens": [ranked[1]], "begin_suppress_tokens": [ranked[2]], "bad_words_ids": [[ranked[3]]],
        "forced_bos_token_id": 1, "forced_eos_token_id": 2,
    }


@pytest.fixture(scope="module")
def opinionated_dir(tmp_path_factory):
    """A model folder whose generation_config.json sets all of `model_settings`."""
    from transformers import GenerationConfig

    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=0).eval()
    with torch.no_grad():
        model.model.norm.weight.fill_(8.0)  # a peaked distribution: p(top token) ~ 0.3
    ranked = first_step_logits(model, tok).argsort(descending=True).tolist()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2, **model_settings(ranked))
    path = tmp_path_factory.mktemp("opinionated")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def load(path, lora: bool = False):
    model = load_causal_lm(str(path), trainable=False)
    assert model.generation_config.repetition_penalty == 5.0, "the folder's settings must be loaded"
    if lora:
        from rlhfkit.models.lora import add_lora

        model = add_lora(model, r=4, alpha=8, dropout=0.0, targets=None).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.2)
    return model, load_tokenizer(str(path))


@pytest.mark.parametrize("lora", [False, True], ids=["plain", "lora"])
def test_the_sampler_sees_the_policy_logits_at_every_step(opinionated_dir, monkeypatch, lora):
    """Log-prob equality: at each of 6 decoding steps the scores the full-vocabulary sampler draws
    from equal the policy's own logits for the tokens so far (no processor changed them), and the
    model's min_new_tokens / forced EOS did not set the length."""
    import rlhfkit.rollout.core as core

    seen = []
    real_call = core.ExponentialRaceSampler.__call__

    def recording(self, input_ids, scores):
        seen.append((input_ids.clone(), scores.clone()))
        return real_call(self, input_ids, scores)

    monkeypatch.setattr(core.ExponentialRaceSampler, "__call__", recording)
    model, tok = load(opinionated_dir, lora)
    torch.manual_seed(0)
    out = generate(model, tok, [PROMPT] * 16, SamplingParams(max_new_tokens=6, temperature=T))
    assert len(seen) == out.response_ids.shape[1] >= 2
    for input_ids, scores in seen:  # identical prompts: no padding, every position attended
        with torch.no_grad():
            logits = model(input_ids=input_ids).logits[:, -1].float()
        assert torch.isfinite(scores).all(), "a token was banned"
        torch.testing.assert_close(scores.float(), logits, rtol=0, atol=1e-4 * logits.abs().max().item())
    assert model.generation_config.repetition_penalty == 5.0, "the model's own settings are put back"


def chi_square_z(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson's chi-square of `counts` against `probs`, bins with fewer than `min_expected` expected
    draws pooled, as a standard normal score (Wilson-Hilferty): ~N(0, 1) when the draws follow `probs`."""
    n = float(counts.sum())
    expected = probs.double() * n
    big = expected >= min_expected
    obs = torch.cat([counts.double()[big], counts.double()[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    assert (obs[~keep] == 0).all(), "a draw from a bin of probability 0"
    stat, k = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1
    return ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))


@pytest.mark.parametrize("top_k", [0, 20], ids=["full-vocabulary", "top-k"])
def test_sampled_first_tokens_follow_the_policy_softmax_at_t(opinionated_dir, top_k):
    """Chi-square: 4000 first tokens drawn by generate() against softmax(logits / T) of the policy
    (truncated to its top 20 and renormalised for top_k=20, HF's own warper path). With the folder's
    settings applied the statistic is hundreds of standard deviations out (forced EOS alone puts
    every draw on one token)."""
    model, tok = load(opinionated_dir)
    logits = first_step_logits(model, tok)
    probs = torch.softmax(logits / T, dim=-1)
    if top_k:
        probs = torch.zeros_like(probs).scatter(0, probs.topk(top_k).indices, probs.topk(top_k).values)
        probs = probs / probs.sum()
    torch.manual_seed(1)
    with pytest.warns(UserWarning, match="truncate") if top_k else contextlib.nullcontext():
        params = SamplingParams(max_new_tokens=1, temperature=T, top_k=top_k, stop_ids=(2,))
    out = generate(model, tok, [PROMPT] * 4000, params)
    counts = torch.bincount(out.response_ids[:, 0], minlength=len(probs))
    assert chi_square_z(counts, probs) < 5.0  # p < 3e-7 under the policy; the draws are seeded


def test_a_forced_minimum_length_no_longer_forces_length(opinionated_dir):
    """The folder sets min_new_tokens=6 = max_new_tokens. With the policy's most likely first token
    as the stop id, the share of rows that stop at once is the policy's probability of that token
    (within 5 standard errors), not 0."""
    model, tok = load(opinionated_dir)
    probs = torch.softmax(first_step_logits(model, tok) / T, dim=-1)
    stop = int(probs.argmax())
    n = 2000
    torch.manual_seed(2)
    out = generate(model, tok, [PROMPT] * n, SamplingParams(max_new_tokens=6, temperature=T, stop_ids=(stop,)))
    lengths = out.response_mask.sum(1)
    p = float(probs[stop])
    stopped_at_once = float((lengths == 1).float().mean())
    assert abs(stopped_at_once - p) <= 5 * math.sqrt(p * (1 - p) / n), (stopped_at_once, p)


def test_rlhfkit_generate_offers_the_model_settings_on_request(tmp_path, capsys):
    """`rlhfkit generate --model-generation-config` samples with generation_config.json (here: every
    token but 'a' suppressed, the stop token too, so each completion is 'aaaa'); without the flag it does not."""
    from transformers import GenerationConfig

    from rlhfkit.cli import main

    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=0)
    a = tok.convert_tokens_to_ids("a")
    model.generation_config = GenerationConfig(eos_token_id=2, pad_token_id=2,
                                               suppress_tokens=[i for i in range(len(tok)) if i != a])
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    args = ["generate", "--model", str(tmp_path), "--prompt", "Hi", "--max-new-tokens", "4", "--num-samples", "3"]
    assert main([*args, "--model-generation-config"]) == 0
    with_settings = capsys.readouterr().out.splitlines()
    assert with_settings == ["### Hi", "- aaaa", "- aaaa", "- aaaa"]
    assert main(args) == 0
    plain = capsys.readouterr().out.splitlines()
    assert plain[0] == "### Hi" and len(plain) == 4 and plain[1:] != with_settings[1:]



def test_sample_texts_draws_every_sample_in_one_batch_and_returns_them_per_prompt(tmp_path, monkeypatch):
    """`rlhfkit generate` samples all prompts x samples in one generate() call, a prompt's rows adjacent
    and sharing its prefill, and hands each prompt back its own samples in order."""
    import types

    import rlhfkit.rollout.texts as gen

    tok = build_tokenizer()
    build_tiny_model(len(tok)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    calls = []

    def fake_generate(model, tokenizer, rows, params, batch_size=None, share_prompts=False, **kw):
        calls.append((list(rows), batch_size, share_prompts))
        return types.SimpleNamespace(completions=[f"{row[-12:]}|{j}" for j, row in enumerate(rows)])

    monkeypatch.setattr(gen, "generate", fake_generate)
    prompts = ["first prompt", "second one", "third"]
    out = gen.sample_texts(str(tmp_path), prompts, 2, max_new_tokens=4, dtype="fp32")
    (rows, batch_size, shared), = calls  # one call
    assert len(rows) == 6 and rows[0] == rows[1] != rows[2] == rows[3] != rows[4] == rows[5]
    assert shared and batch_size >= 6
    assert out == [[f"{rows[2 * i][-12:]}|{2 * i}", f"{rows[2 * i][-12:]}|{2 * i + 1}"] for i in range(3)]
    assert [prompts[i] in rows[2 * i] for i in range(3)] == [True] * 3
