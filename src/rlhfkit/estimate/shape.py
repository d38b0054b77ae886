"""The sizes of a Llama-style decoder (SmolLM2, Llama, Mistral, Qwen without biases), from a preset,
a local config.json or a Hub id's config.json, and the parameter counts they give: what
`rlhfkit estimate-memory` (estimate/memory.py) and the FLOP counts of the bench (estimate/flops.py)
are computed from. No weights are loaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from rlhfkit.core.config import check

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-style decoder (SmolLM2, Llama, Mistral, Qwen without biases)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    head_dim: int | None = None

    @property
    def d(self) -> int:
        return self.head_dim or self.hidden // self.heads

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection of one layer."""
        H, q, kv, inter = self.hidden, self.heads * self.d, self.kv_heads * self.d, self.intermediate
        return {"q_proj": (H, q), "k_proj": (H, kv), "v_proj": (H, kv), "o_proj": (q, H),
                "gate_proj": (H, inter), "up_proj": (H, inter), "down_proj": (inter, H)}

    def param_count(self) -> int:
        """Embeddings (+ untied LM head) + per layer (projections + 2 norms) + final norm."""
        per_layer = sum(i * o for i, o in self.linear_shapes().values()) + 2 * self.hidden
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return embed + self.layers * per_layer + self.hidden

    def kept_fp32_in_reference(self) -> int:
        """Parameters a bf16 reference copy keeps in fp32: embeddings (+ untied head) and the norms."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + (2 * self.layers + 1) * self.hidden

    def lora_count(self, r: int, top_layers: int | None = None, targets=LORA_TARGETS) -> int:
        """r * (in + out) per adapted projection, on the top `top_layers` layers (None: all)."""
        n = self.layers if top_layers is None else min(top_layers, self.layers)
        return n * sum(r * (i + o) for name, (i, o) in self.linear_shapes().items() if name in targets)

    def adapted_count(self, top_layers: int | None = None, targets=LORA_TARGETS) -> int:
        """Base weights under LoRA adapters: in * out per adapted projection."""
        n = self.layers if top_layers is None else min(top_layers, self.layers)
        return n * sum(i * o for name, (i, o) in self.linear_shapes().items() if name in targets)

    @classmethod
    def from_config(cls, cfg: dict) -> ModelShape:
        """From a Hugging Face config.json mapping."""
        return cls(hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"], layers=cfg["num_hidden_layers"],
                   heads=cfg["num_attention_heads"], kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
                   vocab=cfg["vocab_size"], tied=bool(cfg.get("tie_word_embeddings", False)),
                   head_dim=cfg.get("head_dim"))


# Published configurations (config.json of each model), for estimates without the weights at hand.
PRESETS = {
    "smollm2-135m": ModelShape(576, 1536, 30, 9, 3, 49152, tied=True),
    "smollm2-1.7b": ModelShape(2048, 8192, 24, 32, 32, 49152, tied=True),
    "llama-2-7b": ModelShape(4096, 11008, 32, 32, 32, 32000, tied=False),
    "llama-3-8b": ModelShape(4096, 14336, 32, 32, 8, 128256, tied=False),
}
ALIASES = {"smollm2-135m-instruct": "smollm2-135m"}


def resolve_shape(model: str) -> ModelShape:
    """A preset name, a local model folder with a config.json, or a Hub id (``org/name[@revision]``)
    whose config.json is in the Hugging Face cache or, online, fetched alone: no weights are loaded
    or downloaded."""
    from rlhfkit.models.loading import hub_reference

    name = ALIASES.get(model, model)
    if name in PRESETS:
        return PRESETS[name]
    hub = hub_reference(model)
    path = hub_config(*hub) if hub is not None else Path(model).expanduser() / "config.json"
    check(path.is_file(), f"model={model!r}: expected one of {', '.join(PRESETS)}, a local folder with config.json "
                          "or a Hub id (org/name[@revision]) in the Hugging Face cache")
    return ModelShape.from_config(json.loads(path.read_text()))


def hub_config(repo_id: str, revision: str | None) -> Path:
    """The config.json of a Hub model: from the cache (HF_HUB_OFFLINE=1), else fetched alone; a
    missing path when neither works (the caller says what was expected)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    from rlhfkit.models.loading import hub_cache, hub_offline

    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=hub_cache(),
                                    local_files_only=hub_offline()))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError):
        return Path(os.devnull) / "config.json"
