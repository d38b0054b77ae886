"""Reward model: a transformer backbone + a linear scalar head, read at the last non-pad token.

Notation: B batch, L sequence length, H hidden size.

The backbone is the decoder of a causal LM (`AutoModel` of a causal-LM folder, e.g. SmolLM2)
or a small bidirectional encoder (BERT-style, e.g. all-MiniLM-L6-v2). The score of a sequence
is `head(h[b, last])`, where `last` is the last position whose attention mask is 1
(docs/pitfalls.md#score-placement):
never the first `token == pad_id`, because pad == eos for SmolLM2 and the text ends in eos.

A saved reward model folder in rlhfkit's form (`rlhfkit rm` writes RUN/final/rlhfkit_rm beside the
standard AutoModelForSequenceClassification model in RUN/final, or RUN/final itself when the model
has no standard form) holds
  - the backbone: a LoRA adapter (adapter_config.json + weights; its base is recorded in
    rlhfkit_rm.json) or full weights (config.json + model.safetensors), Hugging Face format
  - score_head.safetensors      the scalar head (always trained, also with LoRA:
                                docs/pitfalls.md#lora-reference)
  - rlhfkit_rm.json             formatting, pooling, dtype and the normalisation statistics
  - the tokenizer files
`load_reward_scorer(PATH)` turns it into a reward function, which is what `reward=model:PATH`
in PPO/GRPO uses.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlhfkit.algos import last_valid_index
from rlhfkit.data.chat import format_example, text_of
from rlhfkit.errors import UserError
from rlhfkit.models.classifier_reward import ENCODER_TYPES, is_classifier_folder, load_classifier_scorer
from rlhfkit.models.loading import (
    DTYPES,
    disable_dropout,
    hub_reference,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
    save_tokenizer,
)
from rlhfkit.models.lora import check_lora_targets, fan_in_fan_out, top_layer_indices
from rlhfkit.models.policy import output_width
from rlhfkit.models.trunk import position_ids_from_mask

META_FILE = "rlhfkit_rm.json"
HEAD_FILE = "score_head.safetensors"
NORMALIZE_MODES = ("none", "center", "standardize")
POOLING_MODES = ("auto", "last", "mean")


# ----------------------------------------------------------------------------- formatting


# ----------------------------------------------------------------------------- model


class ScoreHead(nn.Module):
    """Linear map hidden -> scalar, kept in fp32 (also under bf16 autocast).

    Initialised N(0, 1/(H+1)) as in TRL / Stiennon et al. 2020, so initial scores are O(1)
    and differ between sequences (a zero head would give every pair a zero gradient for the
    backbone in the first step).
    """

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.normal_(self.linear.weight, std=1.0 / math.sqrt(hidden_size + 1))
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (B, H) -> (B,)
        with torch.autocast(hidden.device.type, enabled=False):
            return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)


class RewardModel(nn.Module):
    """Backbone + ScoreHead. `forward(input_ids, attention_mask) -> scores (B,)` (fp32)."""

    def __init__(self, backbone: nn.Module, head: ScoreHead, causal: bool = True, pooling: str = "last"):
        super().__init__()
        if pooling not in ("last", "mean"):
            raise ValueError(f"pooling must be 'last' or 'mean', got {pooling!r}")
        self.backbone = backbone
        self.head = head
        self.causal = causal
        self.pooling = pooling

    @property
    def config(self):
        return _base(self.backbone).config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = {}
        if self.causal:  # positions that skip left padding (docs/pitfalls.md#padding-and-positions)
            kwargs = {"position_ids": position_ids_from_mask(attention_mask), "use_cache": False}
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state  # (B, L, H)
        if self.pooling == "last":
            idx = last_valid_index(attention_mask)  # (B,) from the mask, for left and right padding
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), idx]  # (B, H)
        else:
            m = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1)
        return self.head(pooled)


def _base(model: nn.Module) -> nn.Module:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def load_backbone(spec: str, dtype: str = "fp32") -> tuple[nn.Module, bool]:
    """(backbone, causal?) from a model spec: the default model, a causal-LM or encoder folder or Hub id
    (``org/name[@revision]``), or an SFT LoRA adapter folder (merged onto its base)."""
    from transformers import AutoConfig, AutoModel

    path = resolve_model_path(spec)
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        lm = load_causal_lm(spec, dtype=dtype, trainable=True)
        return lm.get_decoder(), True
    try:
        config = AutoConfig.from_pretrained(path)
        causal = config.model_type not in ENCODER_TYPES
        backbone = AutoModel.from_pretrained(path, dtype=DTYPES[dtype])
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"{path}: could not load a reward-model backbone ({str(e).splitlines()[0]})") from None
    return disable_dropout(backbone), causal


def add_backbone_lora(backbone: nn.Module, r: int, alpha: int, dropout: float, targets: list[str] | None,
                      last_layers: int | None = None) -> nn.Module:
    """LoRA on a bare backbone (no task head); the score head stays outside and fully trainable.

    `last_layers=N` adapts only the top N transformer layers: the backward pass then stops at the
    first adapted layer, so a training step costs about a forward pass plus N layers of backward.
    """
    from peft import LoraConfig, get_peft_model

    layers = None
    if last_layers:
        layers = top_layer_indices(backbone.config, last_layers)
        n = backbone.config.num_hidden_layers
        # the ModuleList holding the n layers ("layers" in Llama, "layer" in BERT)
        pattern = next((name.rsplit(".", 1)[-1] for name, mod in backbone.named_modules()
                        if isinstance(mod, nn.ModuleList) and len(mod) == n), None)
    targets = check_lora_targets(backbone, targets)
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none", target_modules=targets,
                     fan_in_fan_out=fan_in_fan_out(backbone, targets), layers_to_transform=layers,
                     layers_pattern=pattern if layers else None)
    return get_peft_model(backbone, cfg)


def resolve_pooling(pooling: str, causal: bool) -> str:
    """'auto': the last non-pad token for causal LMs, the masked mean for encoders."""
    if pooling == "auto":
        return "last" if causal else "mean"
    return pooling


# ----------------------------------------------------------------------------- save / load


def save_reward_model(model: RewardModel, tokenizer, out_dir: str | Path, meta: dict, merge: bool = False,
                      state_dict: dict | None = None) -> Path:
    """Backbone (adapter, or full/merged weights) + head + tokenizer + rlhfkit_rm.json. `state_dict`:
    the model's full weights when the live ones are sharded (FSDP/ZeRO-3; an adapter stays unmerged)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backbone = model.backbone
    is_adapter = hasattr(backbone, "peft_config")
    if merge and is_adapter and state_dict is None:
        backbone = copy.deepcopy(backbone).merge_and_unload()
        is_adapter = False

    def part(prefix: str) -> dict | None:
        return None if state_dict is None else {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}

    backbone.save_pretrained(out, state_dict=part("backbone."))
    save_tokenizer(tokenizer, out)
    head = part("head.") or model.head.state_dict()
    save_file({k: v.detach().float().contiguous().cpu() for k, v in head.items()}, out / HEAD_FILE)
    full = {**meta, "adapter": is_adapter, "causal": model.causal, "pooling": model.pooling, "head": HEAD_FILE}
    (out / META_FILE).write_text(json.dumps(full, indent=2))
    return out


def write_form_pointer(folder: Path, subfolder: str) -> None:
    """folder/rlhfkit_rm.json saying that the rlhfkit form lies in folder/`subfolder` (folder itself is the
    standard sequence-classification model): a copy of the form's own metadata plus ``rlhfkit_form``."""
    meta = json.loads((folder / subfolder / META_FILE).read_text())
    (folder / META_FILE).write_text(json.dumps({**meta, "rlhfkit_form": subfolder}, indent=2))


def rlhfkit_form(folder: Path) -> Path:
    """Where the rlhfkit form of a reward model folder lies: folder itself, or the subfolder its
    rlhfkit_rm.json names (`rlhfkit rm` puts the standard model in RUN/final, write_form_pointer)."""
    sub = read_meta(folder).get("rlhfkit_form")
    return folder / sub if isinstance(sub, str) and sub else folder


def read_meta(path: str | Path) -> dict:
    folder = Path(path)
    f = folder / META_FILE
    if not f.is_file():
        raise UserError(f"{folder}: not a reward model folder (no {META_FILE} from `rlhfkit rm`, no config.json of "
                        "a ...ForSequenceClassification model)")
    try:
        return json.loads(f.read_text())
    except ValueError as e:
        raise UserError(f"{f}: invalid JSON ({e})") from None


def load_reward_model(path: str | Path, dtype: str | None = None):
    """(RewardModel in eval mode, frozen; tokenizer; meta) from a folder written by `rlhfkit rm`, or a Hub id
    (``org/name[@revision]``) of one."""
    from peft import PeftModel
    from safetensors.torch import load_file

    folder = resolve_model_path(str(path)) if hub_reference(str(path)) else Path(path)  # org/name[@rev]: its snapshot
    folder = rlhfkit_form(folder)
    meta = read_meta(folder)
    dtype = dtype or meta.get("dtype", "fp32")
    if meta.get("adapter"):
        backbone, causal = load_backbone(meta["base_model"], dtype)
        backbone = PeftModel.from_pretrained(backbone, folder).merge_and_unload()
    else:
        backbone, causal = load_backbone(str(folder), dtype)
    head = ScoreHead(output_width(backbone))
    head.load_state_dict(load_file(folder / meta.get("head", HEAD_FILE)))
    model = RewardModel(backbone, head, causal=meta.get("causal", causal), pooling=meta.get("pooling", "last"))
    tok = load_tokenizer(str(folder), padding_side=meta.get("padding_side", "left"))
    return model.eval().requires_grad_(False), tok, meta


# ----------------------------------------------------------------------------- scoring


def encode_texts(tokenizer, texts: Sequence[str], max_length: int, add_special_tokens: bool) -> dict:
    """Batch-encode full texts; truncation keeps the END (where the score is read)."""
    tokenizer.truncation_side = "left"
    return tokenizer(list(texts), return_tensors="pt", padding=True, truncation=True, max_length=max_length,
                     add_special_tokens=add_special_tokens)


@torch.no_grad()
def score_texts(model: RewardModel, tokenizer, texts: Sequence[str], batch_size: int, max_length: int,
                add_special_tokens: bool, dtype: str = "fp32") -> list[float]:
    """Raw scores of formatted texts, in batches, in eval mode (dropout off), no gradients."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[float] = []
    for i in range(0, len(texts), batch_size):
        enc = encode_texts(tokenizer, texts[i : i + batch_size], max_length, add_special_tokens)
        with _autocast(dtype, device):
            s = model(enc["input_ids"].to(device), enc["attention_mask"].to(device))
        out += s.float().cpu().tolist()
    model.train(was_training)
    return out


def _autocast(dtype: str, device: torch.device):
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def normalise(raw: Sequence[float], mode: str, mean: float, std: float) -> list[float]:
    """'none': raw; 'center': s - mean; 'standardize': (s - mean) / std (train-set statistics)."""
    if mode == "center":
        return [s - mean for s in raw]
    if mode == "standardize":
        return [(s - mean) / max(std, 1e-6) for s in raw]
    return [float(s) for s in raw]


class RewardScorer:
    """A reward function `(prompts, completions, **info) -> list[float]` backed by a RewardModel.

    Formats each pair exactly as training did (same template flag, system prompt, special tokens,
    truncation), scores in batches without gradients, then applies the saved normalisation.
    """

    def __init__(self, model: RewardModel, tokenizer, meta: dict, batch_size: int = 16,
                 normalize: str | None = None):
        self.model = model
        self.tok = tokenizer
        self.meta = meta
        self.batch_size = batch_size
        self.normalize = normalize or meta.get("normalize", "none")
        self.dtype = meta.get("dtype", "fp32")

    def texts(self, prompts: Sequence, completions: Sequence[str]) -> list[str]:
        # Saved true (older models) means "the template, when there is one"; false means plain.
        chat = None if self.meta.get("chat_template", True) is not False else False
        system = self.meta.get("system_prompt")
        return [format_example(self.tok, p, c, chat, system)[1] for p, c in zip(prompts, completions)]

    def raw_scores(self, prompts: Sequence, completions: Sequence[str]) -> list[float]:
        """Scores before normalisation."""
        return score_texts(self.model, self.tok, self.texts(prompts, completions), self.batch_size,
                           self.meta.get("max_length", 512), self.meta.get("add_special_tokens", False), self.dtype)

    def __call__(self, prompts: Sequence, completions: Sequence[str], **info: Any) -> list[float]:
        raw = self.raw_scores(prompts, [text_of(c) for c in completions])
        return normalise(raw, self.normalize, self.meta.get("score_mean", 0.0), self.meta.get("score_std", 1.0))


def load_reward_scorer(path: str, batch_size: int = 16, device: str | None = None):
    """The reward function behind `reward=model:PATH`: a folder written by `rlhfkit rm`, or any
    transformers AutoModelForSequenceClassification folder or Hub id (models/classifier_reward.py)."""
    folder = resolve_model_path(str(path)) if hub_reference(str(path)) else Path(path)
    if not (folder / META_FILE).is_file() and is_classifier_folder(folder):
        return load_classifier_scorer(folder, batch_size=batch_size, device=device)
    model, tok, meta = load_reward_model(path)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    scorer = RewardScorer(model.to(dev), tok, meta, batch_size=batch_size)
    scorer.__name__ = f"model:{path}"  # type: ignore[attr-defined]
    return scorer
