"""TRL's ``peft_config=LoraConfig(...)`` as rlhfkit's lora options.

TRL's trainers take a peft ``LoraConfig`` (None: full fine-tuning); rlhfkit's configs take
``peft_config=`` the same way and read its r, lora_alpha, lora_dropout and target_modules into
``lora_r``, ``lora_alpha``, ``lora_dropout`` and ``lora_target_modules`` (``lora=true``). A field
rlhfkit cannot honour (DoRA, rsLoRA, trained biases, extra modules to save, per-layer patterns) is
refused in one line rather than dropped. A mapping with the same fields (a YAML ``peft_config:``)
reads the same way. Nothing here imports peft: the object is read by its attributes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlhfkit.errors import ConfigError

LORA_FIELDS = {"r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
               "target_modules": "lora_target_modules"}
# LoraConfig fields rlhfkit reads no further: each is fine at the value shown (peft's default)
HONOURED_AT = {"bias": "none", "use_rslora": False, "use_dora": False, "modules_to_save": None,
               "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
               "init_lora_weights": True, "fan_in_fan_out": False, "exclude_modules": None,
               "trainable_token_indices": None, "target_parameters": None}
IGNORED = {"task_type", "inference_mode", "peft_type", "base_model_name_or_path", "revision", "auto_mapping"}


def _fields_of(peft_config: Any) -> dict[str, Any]:
    """A LoraConfig's (or a mapping's) fields as a dict."""
    if isinstance(peft_config, dict):
        return dict(peft_config)
    kind = type(peft_config).__name__
    if kind != "LoraConfig" and not hasattr(peft_config, "lora_alpha"):
        raise ConfigError(f"peft_config: expected a peft LoraConfig (or None for full fine-tuning), got {kind}")
    if hasattr(peft_config, "to_dict"):
        return dict(peft_config.to_dict())
    return dict(vars(peft_config))


def _unset(value: Any, default: Any) -> bool:
    return value == default or (default in (None, {}) and not value)


def peft_values(fields: Iterable[str], values: dict[str, Any]) -> dict[str, Any]:
    """`values` with ``peft_config`` (a LoraConfig, a mapping of its fields, or None) replaced by the
    lora options; a field rlhfkit cannot honour is a one-line ConfigError."""
    if "peft_config" not in values or "peft_config" in set(fields) or "lora" not in set(fields):
        return values
    values = dict(values)
    peft_config = values.pop("peft_config")
    if peft_config is None:
        values["lora"] = False
        return values
    given = _fields_of(peft_config)
    defaults = dict(HONOURED_AT)
    if not isinstance(peft_config, dict):  # every field a LoraConfig holds, at its class's default
        try:
            defaults.update({k: v for k, v in _fields_of(type(peft_config)()).items()
                             if k not in LORA_FIELDS and k not in IGNORED})
        except (TypeError, ValueError):
            pass
    refused = [f"{k}={given[k]!r}" for k, default in defaults.items() if k in given and not _unset(given[k], default)]
    unknown = sorted(set(given) - set(LORA_FIELDS) - set(HONOURED_AT) - IGNORED)
    if refused:
        raise ConfigError(f"peft_config: rlhfkit trains plain LoRA (r, lora_alpha, lora_dropout, target_modules); "
                          f"it cannot honour {', '.join(refused)}")
    if unknown and isinstance(peft_config, dict):
        raise ConfigError(f"peft_config: unknown LoraConfig field(s) {', '.join(unknown)} (rlhfkit reads "
                          f"{', '.join(LORA_FIELDS)})")
    values["lora"] = True
    for key, option in LORA_FIELDS.items():
        value = given.get(key)
        if value is None:
            continue
        if key == "target_modules" and not isinstance(value, str):
            value = sorted(value)
        if option in values and values[option] != value:
            raise ConfigError(f"peft_config's {key} ({value!r}) and {option}={values[option]!r} disagree: give one")
        values[option] = value
    return values
