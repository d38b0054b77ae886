"""Fast full-vocabulary sampling for HF `generate`, from exactly the policy's distribution.

`ExponentialRaceSampler` draws each row's token as argmax_i p_i / E_i with E_i ~ Exp(1), which
picks token i with probability p_i. It is the algorithm torch.multinomial uses for one sample,
with E = -log(U) from `torch.rand`: torch's `exponential_` takes about 20 ms per decoding step
for 16 x 49152 values on 2 CPU cores, rand + log about 4 ms. (Sampling also runs LoRA layers
merged: models/lora.py `merged_lora`.)

`thread_generator(g)` makes the calling thread's races draw from `g`: a sampler thread beside the
trainer (trainers/offpolicy.py) then samples a function of its own seed alone.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from transformers import LogitsProcessor

_local = threading.local()


@contextlib.contextmanager
def thread_generator(generator: torch.Generator):
    """Within the block, exponential races run by this thread draw from `generator` (on the
    device they sample on) instead of torch's global generator, which other threads share."""
    previous = getattr(_local, "generator", None)
    _local.generator = generator
    try:
        yield generator
    finally:
        _local.generator = previous


def exponential_race(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of `probs` (B, V) (non-negative, any scale), token i with probability
    probs[i] / sum(probs). Returns (B,) long. Uses torch's global generator, or the calling
    thread's `thread_generator`."""
    g = getattr(_local, "generator", None)
    u = torch.rand_like(probs) if g is None else torch.rand(probs.shape, generator=g, dtype=probs.dtype,
                                                            device=probs.device)
    exp_noise = u.log_().neg_()  # Exp(1); U = 0 gives +inf, so that token loses
    return torch.div(probs, exp_noise, out=exp_noise).argmax(dim=-1)  # p / E in the noise's buffer: no new (B, V)


class ExponentialRaceSampler(LogitsProcessor):
    """An HF logits processor that samples at `temperature` from the full vocabulary and returns
    scores that are 0 at the drawn token and -inf elsewhere, so generate's greedy step (argmax)
    emits it. Use with `do_sample=False` and no other warpers."""

    def __init__(self, temperature: float):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
        self.temperature = temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        z = scores.float()  # at T = 1 no division: the same values, one (B, V) pass fewer
        probs = torch.softmax(z if self.temperature == 1.0 else z / self.temperature, dim=-1)
        token = exponential_race(probs)
        return torch.full_like(scores, float("-inf")).scatter_(1, token[:, None], 0.0)
