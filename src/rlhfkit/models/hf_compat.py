"""Every use of transformers' internals in rlhfkit, in one place (tests/test_source_rules.py checks
that no other file names them), so a transformers release that renames one is a change here only.

  - the KV cache: a forward or `generate` takes it as `cache=` and returns it as `.cache` where the
    installed transformers has that name (5.24 does: `past_key_values=` warns that it goes in
    5.40), else as `past_key_values` (`cache_kwargs`, `returned_cache`); new caches (`dynamic_cache`,
    `static_cache`, `static_layers_only`);
  - activation checkpointing, renamed from gradient_* to activation_* during transformers 5
    (`set_activation_checkpointing`, `is_checkpointing`);
  - names transformers keeps in submodules: GPT-2's `Conv1D` layer (`conv1d_type`, for LoRA) and the
    model types AutoModelForCausalLM loads (`causal_lm_model_types`, for a model folder's check);
  - the sdpa attention function rlhfkit runs instead of transformers' own (models/attention.py):
    `transformers_sdpa` calls transformers' kernel wrapper, `register_sdpa` names rlhfkit's, and
    `use_attention` makes one model run it.

The choice is per model: `register_sdpa` adds a named implementation beside transformers' own (with
the masks transformers builds for sdpa) and `use_attention` switches one loaded model to it
(models/loading.py); other models in the process keep transformers' sdpa, and a saved model's
config.json names no rlhfkit implementation. What stays process-wide is transformers' module-level
grouped-heads decision, which has no per-model hook: it is wrapped once, and the wrapper changes a
decision only inside rlhfkit's attention function (per thread flags, models/attention.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch


@functools.cache
def cache_keyword() -> str:
    """The name a forward and `generate` take the KV cache by, and model outputs return it as:
    "cache" where the installed transformers has it (its outputs declare a `cache` field), else
    "past_key_values"."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    fields = {f.name for f in dataclasses.fields(BaseModelOutputWithPast)}
    return "cache" if "cache" in fields else "past_key_values"


def cache_kwargs(cache) -> dict:
    """Keyword arguments that hand `cache` to a forward or `generate`; none for None."""
    return {} if cache is None else {cache_keyword(): cache}


def returned_cache(output):
    """The KV cache a forward run with use_cache=True returned."""
    return getattr(output, cache_keyword())


def dynamic_cache(config):
    """An empty growing cache (transformers' DynamicCache) for a model of `config`."""
    from transformers import DynamicCache

    return DynamicCache(config=config)


def static_cache(config, columns: int):
    """An empty preallocated cache (transformers' StaticCache) of `columns` columns; its `layers`
    allocate on their first `update`."""
    from transformers import StaticCache

    return StaticCache(config=config, max_cache_len=columns)


def static_layers_only(config) -> bool:
    """Every layer of a static cache for `config` is a full-attention static layer (no sliding window)."""
    from transformers.cache_utils import StaticLayer

    return all(type(layer) is StaticLayer for layer in static_cache(config, 1).layers)


def set_activation_checkpointing(base: torch.nn.Module, enabled: bool, kwargs: dict | None = None) -> None:
    """Turn activation checkpointing of the transformers model `base` on (with checkpoint `kwargs`) or
    off: `activation_checkpointing_*` where the installed transformers has them (5.24 does), else
    `gradient_checkpointing_*` (5.0)."""
    new_api = hasattr(base, "activation_checkpointing_enable")
    if enabled and new_api:
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif enabled:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        (base.activation_checkpointing_disable if new_api else base.gradient_checkpointing_disable)()


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Activation checkpointing is on (`is_activation_checkpointing`, formerly `is_gradient_checkpointing`)."""
    flag = getattr(type(model), "is_activation_checkpointing", None)
    return bool(model.is_activation_checkpointing if flag is not None else getattr(model, "is_gradient_checkpointing", False))


def transformers_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' own sdpa attention function (its signature and result)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def register_sdpa(name: str, attention: Callable, grouped_heads: Callable[[Callable], Callable]) -> None:
    """Make `name` an attention implementation a model may choose (`use_attention`): `attention`
    (transformers' sdpa signature) with the masks transformers builds for sdpa, and decide grouped
    heads by `grouped_heads(transformers' decision)` (a function of the same signature; see the
    module docstring for why that one is process-wide). Idempotent; a transformers without the
    grouped-heads decision keeps copying the heads (the same results)."""
    from transformers import AttentionInterface
    from transformers.integrations import sdpa_attention as hf_sdpa
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention)  # the mapping every model file reads at call time
    AttentionMaskInterface.register(name, sdpa_mask)  # the same masks as for "sdpa"
    decide = getattr(hf_sdpa, "use_gqa_in_sdpa", None)
    if decide is None or getattr(decide, "rlhfkit_grouped", False):
        return
    wrapped = grouped_heads(decide)
    wrapped.rlhfkit_grouped = True
    hf_sdpa.use_gqa_in_sdpa = wrapped


def use_attention(model, name: str) -> bool:
    """`model` (and its sub-models) runs the registered implementation `name` where it ran
    transformers' sdpa; a model on another implementation (eager, flash) is left as it is. True
    when switched. Not saved: config.json keeps transformers' own name."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    model.set_attn_implementation(name)
    return True


def conv1d_type() -> type:
    """transformers' Conv1D (GPT-2's projections: a linear layer with its weight stored transposed)."""
    from transformers.pytorch_utils import Conv1D

    return Conv1D


def causal_lm_model_types():
    """The `model_type`s AutoModelForCausalLM can load (a mapping's keys)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
