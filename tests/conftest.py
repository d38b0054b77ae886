"""Shared fixtures: a tiny Llama model and tokenizer folder (see tiny_lm.py)."""

from __future__ import annotations

import os

import pytest
import torch

from tiny_lm import build_tiny_model, build_tokenizer

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under pytest-xdist every worker is a process of its own: one thread each keeps the cores from being
# oversubscribed (the workers already use every core).
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


def pytest_collection_modifyitems(config, items):
    """Skip GPU tests without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny Llama + tokenizer folder, usable as `model=PATH` by every command."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tok = build_tokenizer()
    model = build_tiny_model(len(tok))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture()
def tiny_tokenizer():
    return build_tokenizer()




@pytest.fixture()
def patch_everywhere(monkeypatch):
    """patch(module, name, value): set `module.name` and the same name in every loaded rlhfkit module that
    imported it (`from module import name` binds its own reference), undone after the test. Import the code
    under test first, so its modules are loaded when the patch is made."""
    import sys

    def patch(module, name: str, value) -> None:
        original = getattr(module, name)
        monkeypatch.setattr(module, name, value)
        for loaded in list(sys.modules.values()):
            if getattr(loaded, "__name__", "").startswith("rlhfkit") and getattr(loaded, name, None) is original:
                monkeypatch.setattr(loaded, name, value)

    return patch
