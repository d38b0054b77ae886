"""Chat formatting with and without a chat template, on tiny offline tokenizers."""

from __future__ import annotations

import pytest

from rlhfkit.data.chat import (
    IGNORE_INDEX,
    format_prompt,
    format_sft_example,
    tokenize_sft_example,
    use_chat_template,
)
from rlhfkit.errors import ConfigError, DataError


def test_plain_format_single_turn(plain_tokenizer):
    assert plain_tokenizer.chat_template is None
    assert format_prompt(plain_tokenizer, "What is 7 + 5?") == "User: What is 7 + 5?\n\nAssistant: "


def test_plain_format_multi_turn_with_system(plain_tokenizer):
    conv = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a fruit."},
    ]
    assert format_prompt(plain_tokenizer, conv, system="Be brief.") == (
        "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser: Name a fruit.\n\nAssistant: "
    )


def test_chat_template_with_generation_prompt(chat_tokenizer):
    assert format_prompt(chat_tokenizer, "hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_system_replaces_a_leading_system_turn(chat_tokenizer):
    conv = [{"role": "system", "content": "old"}, {"role": "user", "content": "hi"}]
    text = format_prompt(chat_tokenizer, conv, system="new")
    assert text.startswith("<|im_start|>system\nnew<|im_end|>\n<|im_start|>user\nhi")
    assert "old" not in text


def test_sft_example_with_template_ends_with_eos(chat_tokenizer):
    prompt_text, full_text = format_sft_example(chat_tokenizer, "hi", "Hello!")
    assert prompt_text == format_prompt(chat_tokenizer, "hi")
    assert full_text == prompt_text + "Hello!<|im_end|>"


def test_sft_example_without_template(plain_tokenizer):
    prompt_text, full_text = format_sft_example(plain_tokenizer, "hi", "Hello!")
    assert prompt_text == "User: hi\n\nAssistant: "
    assert full_text == "User: hi\n\nAssistant: Hello!<|im_end|>"


def test_sft_example_without_any_eos_token(tokenizer_factory):
    tok = tokenizer_factory(eos=False)
    assert tok.eos_token is None
    assert format_sft_example(tok, "hi", "Hello!")[1] == "User: hi\n\nAssistant: Hello!"


@pytest.mark.parametrize("fixture", ["plain_tokenizer", "chat_tokenizer"])
def test_label_mask_covers_exactly_the_response(request, fixture):
    tok = request.getfixturevalue(fixture)
    prompt_text, full_text = format_sft_example(tok, "hello there", "Hello! How can I help?")
    enc = tokenize_sft_example(tok, prompt_text, full_text)
    ids, labels = enc["input_ids"], enc["labels"]
    assert len(ids) == len(labels) == len(enc["attention_mask"])
    n_prompt = labels.count(IGNORE_INDEX)
    assert labels[:n_prompt] == [IGNORE_INDEX] * n_prompt and IGNORE_INDEX not in labels[n_prompt:]
    assert tok.decode(ids[:n_prompt]) == prompt_text
    assert tok.decode(labels[n_prompt:]) == "Hello! How can I help?<|im_end|>"


def test_bpe_merge_across_the_boundary_is_handled(plain_tokenizer):
    # "Assistant: " ends in a space that byte-level BPE glues onto the next word
    # ("ĠH"), so naive prefix-length masking would be off by one token.
    prompt_text = "User: hello\n\nAssistant: "
    full_text = prompt_text + "Hello<|im_end|>"
    alone = plain_tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    joint = plain_tokenizer(full_text, add_special_tokens=False)["input_ids"]
    assert joint[: len(alone)] != alone  # the premise of this test
    enc = tokenize_sft_example(plain_tokenizer, prompt_text, full_text)
    n_prompt = enc["labels"].count(IGNORE_INDEX)
    assert enc["input_ids"][:n_prompt] == alone
    assert plain_tokenizer.decode(enc["labels"][n_prompt:]) == "Hello<|im_end|>"


def test_max_length_truncates_from_the_right(chat_tokenizer):
    prompt_text, full_text = format_sft_example(chat_tokenizer, "hi", "Hello! How can I help?")
    enc = tokenize_sft_example(chat_tokenizer, prompt_text, full_text, max_length=5)
    assert len(enc["input_ids"]) == len(enc["labels"]) == 5


def test_template_errors_become_data_errors(tokenizer_factory):
    strict = tokenizer_factory("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(DataError, match="chat template rejected the conversation: roles must alternate"):
        format_prompt(strict, "hi")


def test_bad_prompt_type_is_a_data_error(plain_tokenizer):
    with pytest.raises(DataError, match="a prompt must be a string or a list"):
        format_prompt(plain_tokenizer, 42)  # type: ignore[arg-type]


def test_chat_template_setting_none_false_true(plain_tokenizer, chat_tokenizer):
    assert use_chat_template(chat_tokenizer, None) is True and use_chat_template(plain_tokenizer, None) is False
    assert use_chat_template(chat_tokenizer, False) is False and use_chat_template(chat_tokenizer, True) is True
    plain_tokenizer.name_or_path = "models/plain"
    with pytest.raises(ConfigError) as err:
        use_chat_template(plain_tokenizer, True)
    assert str(err.value) == (
        "chat_template=true, but the tokenizer of models/plain has no chat template; set chat_template=false "
        "(or leave it unset) to use the plain 'User: ...\\n\\nAssistant: ' format"
    )


def test_format_prompts_plain_format_takes_message_lists_and_the_system_prompt(chat_tokenizer):
    from types import SimpleNamespace

    from rlhfkit.data.chat import format_prompts

    conv = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"}]
    args = SimpleNamespace(chat_template=False, system_prompt="Be brief.")
    assert format_prompts(chat_tokenizer, ["Hi", conv], args) == [
        "System: Be brief.\n\nUser: Hi\n\nAssistant: ",
        "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser: Bye\n\nAssistant: ",
    ]
