"""A tiny Llama-style model and a byte-level tokenizer, built offline for tests.

The tokenizer mimics SmolLM2's special tokens: bos <|im_start|> (1), eos == pad <|im_end|> (2),
unk <|endoftext|> (0), and has a ChatML chat template, so pad == eos code paths are exercised.
"""

from __future__ import annotations

import torch

from rlhfkit.learn.tiny import CHAT_TEMPLATE, CORPUS, build_tiny_model, build_tokenizer  # noqa: F401


def build_tiny_lora_model(seed: int = 0, dropout: float = 0.0):
    """A tiny Llama with LoRA on every projection and a trained-looking adapter (B starts at zero)."""
    from rlhfkit.models.lora import add_lora

    tok = build_tokenizer()
    model = add_lora(build_tiny_model(len(tok), seed=seed).eval(), r=4, alpha=8, dropout=dropout, targets=None)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    return model.eval(), tok


def assert_same_hidden_and_grads(shared: tuple, plain: tuple) -> None:
    """(hidden, {name: grad}) of a shared-computation forward equal the plain forward's, to float rounding."""
    (h1, g1), (h0, g0) = shared, plain
    torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-5)
    assert g1.keys() == g0.keys()
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-4, atol=1e-5 * g0[name].abs().max().item() + 1e-7)
