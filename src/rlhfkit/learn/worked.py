"""What `rlhfkit selfcheck`'s worked examples (commands/selfcheck.py) and the classic bugs made on
purpose (learn/breaks.py) share: a `Check` that records its table and whether every number agreed,
the table's row format, and a tiny random Llama to run them on."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TOL = 1e-9  # float64 golden examples: agreement to ~1e-15 expected; 1e-9 leaves room, catches any real change



@dataclass
class Check:
    """One worked example: what it shows, the table printed, and whether every number agreed."""

    name: str
    title: str
    lines: list[str] = field(default_factory=list)
    ok: bool = True

    def expect(self, got: float, want: float, tol: float = TOL) -> str:
        """'ok' or 'MISMATCH' for one number (tolerance relative to max(1, |want|)), recording failure."""
        good = math.isfinite(got) and abs(got - want) <= tol * max(1.0, abs(want))
        self.ok = self.ok and good
        return "ok" if good else "MISMATCH"


def row(*cells: object, width: int = 11) -> str:
    return "  ".join(f"{c:>{width}.6f}" if isinstance(c, float) else f"{c!s:>{width}}" for c in cells)


def tiny_llama(seed: int = 0):
    """A 2-layer random Llama with peaked next-token distributions (large init), in eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.5, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()
