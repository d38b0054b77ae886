"""Data loading: prompt sets, SFT examples, preference pairs, chat formatting.

Heavy libraries (pyarrow, datasets) are imported only when a file needs them.
"""

from rlhfkit.data.arithmetic import make_problems
from rlhfkit.data.chat import format_prompt, format_sft_example, tokenize_sft_example
from rlhfkit.data.prefs import load_preferences
from rlhfkit.data.prompts import info_fields, load_prompts
from rlhfkit.data.readers import Records, read_records, require_fields
from rlhfkit.data.sft import load_sft_examples

__all__ = [
    "Records",
    "format_prompt",
    "format_sft_example",
    "info_fields",
    "load_preferences",
    "load_prompts",
    "load_sft_examples",
    "make_problems",
    "read_records",
    "require_fields",
    "tokenize_sft_example",
]
