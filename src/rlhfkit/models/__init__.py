"""Models: loading any local causal LM or the built-in default, value heads, references."""

from rlhfkit.models.loading import (
    DEFAULT_MODEL,
    disable_dropout,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
)

__all__ = ["DEFAULT_MODEL", "disable_dropout", "load_causal_lm", "load_tokenizer", "resolve_model_path"]
