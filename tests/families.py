"""Tiny random models of the common causal-LM families, each with a tokenizer shaped like its
family's, built offline for tests (tests/models/test_families.py).

What varies between them is what breaks trainers in practice:
  - special tokens: no pad token (GPT-2, GPT-NeoX), pad distinct from eos (Qwen, Gemma, OPT),
    BOS == EOS (OPT's </s>, GPT-2's <|endoftext|>), a BOS that the tokenizer adds (Llama, Mistral,
    Gemma, OPT) or none at all (Qwen);
  - chat template: none (base models), with a system turn (Llama 3 style, whose template writes the
    BOS itself; Qwen2 with a default system turn; Phi-3), without one (Gemma 2 rejects it);
  - tied (GPT-2, OPT, Qwen, Gemma) and untied (Llama, Mistral, Phi-3, GPT-NeoX) output layers;
  - sliding-window attention with a 4-token window, so it bites within a test's sequences (Mistral,
    Qwen2's second layer, Gemma 2/3's sliding layers, Phi-3);
  - Gemma 2's final-logit and attention soft-capping, with caps small enough to bite on a random
    model; OPT's projection between a 48-wide residual stream and 32-wide embeddings (opt-350m's
    1024 and 512), so the final hidden states are narrower than `hidden_size`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

CORPUS = [
    "Write a short review of the new cafe. It was great, lovely coffee and kind staff.",
    "The film was terrible and boring. I hated the ending but loved the music.",
    "What is 3 + 4? The answer is 7. Sam has 5 apples and buys 2 more.",
    "User: Assistant: System: Continue this story about a lighthouse keeper at night.",
    "aa ee oo ii th strct grd brr sh tkt xyz rhythm",
] * 4

# Llama 3 style: the template writes the BOS itself, and a system turn when there is one.
LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
# Qwen2: ChatML with a default system turn when the conversation has none.
QWEN2_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Gemma 2: BOS in the template, 'model' turns, and no system role.
GEMMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
PHI3_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class Family:
    """One family: its config class and settings, and its tokenizer's special tokens."""

    name: str
    config_class: str
    config: dict
    bos: str | None  # the BOS token (None: the tokenizer has none)
    eos: str
    pad: str | None  # None: no pad token (load_tokenizer falls back to eos)
    add_bos: bool  # the tokenizer prepends BOS when asked for special tokens
    template: str | None = None
    extra_tokens: tuple[str, ...] = ()
    features: tuple[str, ...] = field(default=())  # what a test can check bites: sliding_window, softcap
    system_turn: bool = True  # the chat template (or the plain format) takes a system prompt

    @property
    def system_prompt(self) -> str | None:
        """A system prompt for tests, None where the template rejects one (Gemma 2)."""
        return "Be brief." if self.system_turn else None

    @property
    def specials(self) -> list[str]:
        names = [t for t in (self.bos, self.eos, self.pad) if t is not None] + list(self.extra_tokens)
        return list(dict.fromkeys(names))


def _small(**kw) -> dict:
    base = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128)
    base.update(kw)
    return base


FAMILIES = {
    f.name: f
    for f in [
        Family("llama", "LlamaConfig", _small(tie_word_embeddings=False), bos="<|begin_of_text|>", eos="<|eot_id|>",
               pad=None, add_bos=True, template=LLAMA_TEMPLATE, extra_tokens=("<|start_header_id|>", "<|end_header_id|>")),
        Family("qwen2", "Qwen2Config", _small(tie_word_embeddings=True, use_sliding_window=True, sliding_window=4,
                                              max_window_layers=1),
               bos=None, eos="<|im_end|>", pad="<|endoftext|>", add_bos=False, template=QWEN2_TEMPLATE,
               extra_tokens=("<|im_start|>",), features=("sliding_window",)),
        Family("qwen3", "Qwen3Config", _small(tie_word_embeddings=True, head_dim=8), bos=None, eos="<|im_end|>",
               pad="<|endoftext|>", add_bos=False, template=QWEN3_TEMPLATE, extra_tokens=("<|im_start|>",)),
        Family("mistral", "MistralConfig", _small(tie_word_embeddings=False, sliding_window=4), bos="<s>", eos="</s>",
               pad=None, add_bos=True, features=("sliding_window",)),
        Family("gemma2", "Gemma2Config", _small(head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                                                final_logit_softcapping=0.5, attn_logit_softcapping=1.0,
                                                initializer_range=0.2, tie_word_embeddings=True),
               bos="<bos>", eos="<eos>", pad="<pad>", add_bos=True, template=GEMMA2_TEMPLATE,
               extra_tokens=("<start_of_turn>", "<end_of_turn>"), features=("sliding_window", "softcap"),
               system_turn=False),
        Family("gemma3", "Gemma3TextConfig", _small(head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                                                    layer_types=["sliding_attention", "full_attention"],
                                                    tie_word_embeddings=True),
               bos="<bos>", eos="<eos>", pad="<pad>", add_bos=True, features=("sliding_window",)),
        Family("phi3", "Phi3Config", _small(tie_word_embeddings=False, sliding_window=4, pad_token_id=None),
               bos="<s>", eos="<|end|>", pad="<|endoftext|>", add_bos=False, template=PHI3_TEMPLATE,
               extra_tokens=("<|system|>", "<|user|>", "<|assistant|>"), features=("sliding_window",)),
        Family("gpt2", "GPT2Config", dict(n_embd=32, n_layer=2, n_head=4, n_positions=128, tie_word_embeddings=True),
               bos="<|endoftext|>", eos="<|endoftext|>", pad=None, add_bos=False),
        Family("opt", "OPTConfig", dict(hidden_size=48, word_embed_proj_dim=32, ffn_dim=64, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=128, do_layer_norm_before=False,
                                        tie_word_embeddings=True),
               bos="</s>", eos="</s>", pad="<pad>", add_bos=True),
        Family("gpt_neox", "GPTNeoXConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                 num_attention_heads=4, max_position_embeddings=128,
                                                 tie_word_embeddings=False),
               bos="<|endoftext|>", eos="<|endoftext|>", pad=None, add_bos=False),
    ]
}


def build_family_tokenizer(fam: Family):
    """A byte-level BPE tokenizer (~300 tokens) with the family's special tokens; a post-processor
    prepends BOS when `fam.add_bos` (as Llama's, Gemma's and OPT's tokenizers do)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    unk = "<unk>"
    tk = Tokenizer(models.BPE(unk_token=unk))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[unk] + fam.specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(CORPUS, trainer)
    if fam.add_bos:
        bos_id = tk.token_to_id(fam.bos)
        tk.post_processor = processors.TemplateProcessing(single=f"{fam.bos} $A", pair=f"{fam.bos} $A {fam.bos} $B",
                                                          special_tokens=[(fam.bos, bos_id)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=fam.bos, eos_token=fam.eos, pad_token=fam.pad,
                                  unk_token=unk)
    if fam.extra_tokens:
        tok.add_special_tokens({"additional_special_tokens": list(fam.extra_tokens)})
    if fam.template:
        tok.chat_template = fam.template
    return tok


def build_family_model(fam: Family, tok, seed: int = 0):
    """The family's causal LM, randomly initialised, sized to the tokenizer; special token ids
    taken from it."""
    import transformers

    ids = {k: tok.convert_tokens_to_ids(t) if t is not None else None
           for k, t in (("bos_token_id", fam.bos), ("eos_token_id", fam.eos), ("pad_token_id", fam.pad))}
    cfg = getattr(transformers, fam.config_class)(vocab_size=len(tok), **{**fam.config, **ids})
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def save_family(fam: Family, folder: Path) -> Path:
    """The model and tokenizer folder of `fam` under `folder` (usable as `model=PATH`)."""
    tok = build_family_tokenizer(fam)
    model = build_family_model(fam, tok)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
