"""Fixtures for data tests: tiny tokenizers built offline (nothing is downloaded)."""

from __future__ import annotations

import pytest

SPECIALS = ["[UNK]", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "User: hello there\n\nAssistant: Hello! How can I help?",
    "What is 7 + 5? The answer is 12.",
    "system user assistant Write a short review of the cafe.",
]
# A ChatML-style template like SmolLM2's, small enough to read in a test.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer(chat_template: str | None = None, eos: bool = True):
    """A byte-level BPE tokenizer trained on three strings, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(CORPUS, trainer)
    kwargs = {"eos_token": "<|im_end|>"} if eos else {}
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="[UNK]", **kwargs)
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


@pytest.fixture(scope="session")
def plain_tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def chat_tokenizer():
    return build_tokenizer(CHATML)


@pytest.fixture(scope="session")
def tokenizer_factory():
    """``build_tokenizer`` itself, for tests that need a variant."""
    return build_tokenizer
