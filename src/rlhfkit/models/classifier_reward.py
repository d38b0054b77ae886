"""Reward models in transformers' standard format: ``AutoModelForSequenceClassification`` with one label.

TRL's reward models, the Hub's (e.g. ``OpenAssistant/reward-model-deberta-v3-...``) and the copy
`rlhfkit rm` writes next to its own folder (RUN/final/sequence_classification) are all this: a
backbone plus a ``score``/``classifier`` head, the score read at the last non-pad token (by
``config.pad_token_id``; transformers does the pooling). `reward=model:PATH` takes such a folder
or Hub id through `load_classifier_scorer`.

Texts are formatted as rlhfkit's own reward model formats them (data.chat.format_example:
the chat template when the tokenizer has one, else ``User: ...\\n\\nAssistant: ...``), so the
standard copy of an rlhfkit reward model scores exactly what it scored in training.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlhfkit.data.chat import format_example, text_of
from rlhfkit.errors import UserError

STANDARD_DIR = "sequence_classification"  # RUN/final/<this>: `rlhfkit rm`'s standard copy


def is_classifier_folder(folder: Path) -> bool:
    """A transformers folder whose config names a ...ForSequenceClassification architecture."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(a).endswith("ForSequenceClassification") for a in config.get("architectures") or [])


class ClassifierScorer:
    """A reward function ``(prompts, completions, **info) -> list[float]``: logit 0 of a sequence
    classifier on each formatted (prompt, completion), in batches, eval mode, no gradients."""

    def __init__(self, model, tokenizer, batch_size: int = 16, max_length: int = 1024):
        self.model, self.tok = model, tokenizer
        self.batch_size, self.max_length = batch_size, max_length
        self.causal = not getattr(model.config, "is_encoder_decoder", False) and model.config.model_type not in _encoders()

    def texts(self, prompts: Sequence, completions: Sequence) -> list[str]:
        return [format_example(self.tok, p, text_of(c))[1] for p, c in zip(prompts, completions)]

    @torch.no_grad()
    def __call__(self, prompts: Sequence, completions: Sequence, **info: Any) -> list[float]:
        texts = self.texts(prompts, completions)
        device = next(self.model.parameters()).device
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tok(texts[i : i + self.batch_size], return_tensors="pt", padding=True, truncation=True,
                           max_length=self.max_length, add_special_tokens=not self.causal)
            logits = self.model(input_ids=enc["input_ids"].to(device),
                                attention_mask=enc["attention_mask"].to(device)).logits  # (B, num_labels)
            out += logits[:, 0].float().cpu().tolist()
        return out


# Bidirectional encoders: right padding, their own [CLS]/[SEP] special tokens, no position ids.
ENCODER_TYPES = frozenset({"bert", "roberta", "distilbert", "deberta", "deberta-v2", "electra",
                           "xlm-roberta", "mpnet", "albert", "modernbert"})


def _encoders() -> frozenset:
    return ENCODER_TYPES


def load_classifier_scorer(folder: Path, batch_size: int = 16, device: str | None = None) -> ClassifierScorer:
    """The reward function of a sequence-classification folder (right padding; the pad token is the
    model's, so transformers reads the score at the last real token)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"{folder}: could not load a sequence-classification reward model "
                        f"({str(e).strip().splitlines()[0]})") from None
    if model.config.pad_token_id is None:  # batches of one need none; longer ones pad with eos
        model.config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if tok.pad_token_id != model.config.pad_token_id:  # transformers reads the score before the model's pad id
        tok.pad_token = tok.convert_ids_to_tokens(model.config.pad_token_id)
    tok.padding_side, tok.truncation_side = "right", "left"  # the end, where the score is read, is kept
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    scorer = ClassifierScorer(model.to(dev).eval().requires_grad_(False), tok, batch_size=batch_size)
    scorer.__name__ = f"model:{folder}"  # type: ignore[attr-defined]
    return scorer


def save_classifier(reward_model, tokenizer, out_dir: str | Path) -> Path | None:
    """Write a causal-backbone RewardModel (last-token pooling) as an AutoModelForSequenceClassification
    folder; None when it has no such form (an encoder's pooler, mean pooling). The head's bias is a
    constant added to every score and is left out (the standard ``score`` layer has none); the pad
    token becomes one that never ends a text (eos does, and transformers pools before the last pad)."""
    import copy

    from transformers import AutoModelForSequenceClassification

    backbone = reward_model.backbone
    if hasattr(backbone, "merge_and_unload"):
        backbone = copy.deepcopy(backbone).merge_and_unload()
    if not reward_model.causal or reward_model.pooling != "last":
        return None
    config = copy.deepcopy(backbone.config)
    config.num_labels = 1
    config.architectures = None
    tok = copy.deepcopy(tokenizer)
    if tok.pad_token_id is None or tok.pad_token_id == tok.eos_token_id:
        if tok.unk_token_id is None or tok.unk_token_id == tok.eos_token_id:
            return None
        tok.pad_token = tok.unk_token
    config.pad_token_id = tok.pad_token_id
    try:
        model = AutoModelForSequenceClassification.from_config(config)
    except ValueError:  # an architecture with no sequence-classification class
        return None
    head = getattr(model, "score", None)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return None
    model.base_model.load_state_dict(backbone.state_dict())
    head.weight.data.copy_(reward_model.head.linear.weight.data.to(head.weight.dtype))
    out = Path(out_dir)
    model.save_pretrained(out)
    tok.padding_side = "right"
    tok.save_pretrained(out)
    return out
