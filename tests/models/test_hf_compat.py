"""models/hf_compat.py: the KV cache goes by the name the installed transformers takes, so sampling
and shared-prompt forwards run without its deprecation warnings (an error here), with the same tokens."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from rlhfkit.models.hf_compat import cache_keyword
from rlhfkit.models.shared_prompts import response_hidden
from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.core import generate
from rlhfkit.rollout.decode import lean_generate

from tiny_lm import build_tiny_model, build_tokenizer

# the first two share a prompt, all three a prefix of more than MIN_PREFIX tokens
PROMPTS = ["one two three four five six seven eight nine ten eleven twelve a b",
           "one two three four five six seven eight nine ten eleven twelve a b",
           "one two three four five six seven eight nine ten eleven twelve c"]


def test_the_cache_keyword_is_the_one_the_installed_forward_takes():
    from transformers import LlamaModel

    assert cache_keyword() in inspect.signature(LlamaModel.forward).parameters


@pytest.mark.parametrize("options", [{}, {"share_prompts": True}, {"share_prefix": True}])
def test_sampling_and_shared_prompts_raise_no_deprecation_warning(options):
    tok = build_tokenizer()
    tok.padding_side = "left"
    model = build_tiny_model(len(tok), seed=1).eval()
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # transformers' past_key_values deprecation
        rows = [sample(model, tok, PROMPTS, params, **options).response_ids for sample in (generate, lean_generate)]
        ids = tok(PROMPTS, return_tensors="pt", padding=True)
        pos = (ids.attention_mask.cumsum(1) - 1).clamp(min=0)
        hidden = response_hidden(model.get_decoder(), ids.input_ids, ids.attention_mask, pos, 3,
                                 share_prefix=options.get("share_prefix", False))
    assert torch.equal(rows[0], rows[1])  # generate and the lean loop sample the same greedy tokens
    assert hidden is not None and hidden.shape == (3, 3, model.config.hidden_size)
