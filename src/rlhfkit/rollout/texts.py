"""Sampling texts from a model: `sample_texts` for `rlhfkit generate` and the labelling app, the
helpers eval, prefs, tpo and the trainers reuse (`generate_texts`, `sample_and_score`, `load_for_inference`)."""

from __future__ import annotations

import torch

from rlhfkit.core.precision import autocast
from rlhfkit.data.chat import format_prompt
from rlhfkit.data.prompts import info_lists, reward_inputs
from rlhfkit.models import load_causal_lm, load_tokenizer
from rlhfkit.models.loading import resolve_dtype
from rlhfkit.rewards import score_batch
from rlhfkit.rollout import SamplingParams, generate


def generate_texts(model, tokenizer, formatted: list[str], params: SamplingParams, seed: int,
                   batch_size: int = 16, generation_config=None, share_prompts: bool = False) -> list[str]:
    """Completions for chat-formatted prompt texts, reproducible for a given seed. Only `params`
    decide how tokens are drawn unless `generation_config` (`model_generation_config`) is given.
    `share_prompts`: a prompt repeated in the list is prefilled once."""
    torch.manual_seed(seed)
    return generate(model, tokenizer, formatted, params, batch_size=batch_size, share_prompts=share_prompts,
                    generation_config=generation_config).completions


def model_generation_config(model, tokenizer, max_new_tokens: int, overrides: dict):
    """The model folder's own generation settings (generation_config.json: temperature, top-k/top-p,
    repetition penalty, ...) with rlhfkit's length, pad token and stop token, and `overrides`
    (settings given on the command line) on top. Opt-in for `rlhfkit generate` only."""
    import copy

    from transformers import GenerationConfig

    base = getattr(model, "generation_config", None)
    cfg = copy.deepcopy(base) if base is not None else GenerationConfig()
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
    stops = [i for i in dict.fromkeys([*eos, tokenizer.eos_token_id]) if i is not None]
    cfg.update(max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_token_id=stops, **overrides)
    cfg.max_length = None  # max_new_tokens decides the length
    return cfg


def sample_and_score(model, tokenizer, records: list[dict], formatted: list[str], reward_fn, params: SamplingParams,
                     seed: int, batch_size: int = 16, dtype: str = "fp32") -> tuple[list[str], list[float]]:
    """Sample one completion per prompt and score it with `reward_fn`."""
    device = next(model.parameters()).device
    with autocast(dtype, device):
        completions = generate_texts(model, tokenizer, formatted, params, seed, batch_size)
    scores = score_batch(reward_fn, *reward_inputs(records, completions), info_lists(records))
    return completions, [float(s) for s in scores]


def load_for_inference(model: str, dtype: str = "fp32"):
    """(model, tokenizer) for sampling: a model folder, an rlhfkit run output, or the default."""
    lm = load_causal_lm(model, dtype=dtype, trainable=False)  # first: "not a causal LM" wins over tokenizer errors
    tok = load_tokenizer(model, padding_side="left")
    return lm, tok


def sample_texts(model: str, prompts: list[str], num_samples: int, max_new_tokens: int = 64,
                 temperature: float | None = 1.0, seed: int = 0, use_model_config: bool = False,
                 dtype: str = "auto") -> list[list[str]]:
    """`num_samples` completions for each raw prompt (chat-formatted here). Returns [prompt][sample].
    `use_model_config`: sample with the model folder's own generation settings (`temperature`,
    when not None, still applies); otherwise at `temperature` from the full distribution.
    Every sample of every prompt is drawn in one batch (a prompt's rows share its prefill), so a
    decoding step reads the weights once for all of them; `dtype` 'auto' is bf16 where bf16 matmuls
    are fast, else fp32."""
    dtype = resolve_dtype(dtype)
    lm, tok = load_for_inference(model, dtype)
    formatted = [format_prompt(tok, p) for p in prompts]
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0 if temperature is None else temperature)
    gen_cfg = None
    if use_model_config:
        overrides = ({} if temperature is None else {"do_sample": False} if temperature == 0
                     else {"do_sample": True, "temperature": temperature})
        gen_cfg = model_generation_config(lm, tok, max_new_tokens, overrides)
    rows = [text for text in formatted for _ in range(num_samples)]  # prompt-major: a prompt's samples adjacent
    with autocast(dtype, next(lm.parameters()).device):
        texts = generate_texts(lm, tok, rows, params, seed, batch_size=16 * max(num_samples, 1),
                               generation_config=gen_cfg, share_prompts=num_samples > 1)
    return [texts[i * num_samples : (i + 1) * num_samples] for i in range(len(prompts))]
