"""A tiny Llama-style model and a byte-level tokenizer, built offline for tests.

The tokenizer mimics SmolLM2's special tokens: bos <|im_start|> (1), eos == pad <|im_end|> (2),
unk <|endoftext|> (0), and has a ChatML chat template, so pad == eos code paths are exercised.
"""

from __future__ import annotations

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Write a short review of the new cafe. It was great, lovely coffee and kind staff.",
    "The film was terrible and boring. I hated the ending but loved the music.",
    "What is 3 + 4? The answer is 7. Sam has 5 apples and buys 2 more.",
    "user assistant system: Continue this story about a lighthouse keeper at night.",
] * 4


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_model(vocab_size: int, seed: int = 0, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaForCausalLM(cfg)


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
