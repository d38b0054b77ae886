"""Runaway and nonsense inputs (counts no machine finishes, schedules that never reach their lr,
options beyond the model, binary or one-object data files, bad environment values, text options
that are not valid Unicode): one line, exit 2, nothing written, through the real entry point."""

from __future__ import annotations

import json

import pytest
from test_bad_input import assert_clean_error, inputs, run_cli, work  # noqa: F401 (fixtures)

BAD_FILES = {
    "nul.txt": b"Write a story\nabout\x00 cats\n",
    "one_object.json": json.dumps({"prompt": "only one"}).encode(),
    "surrogate.yaml": b'lr: 1e-4\nsystem_prompt: "be \\ud800 kind"\n',
}

# (case id, command, overrides, fragments; {in} = the inputs folder)
CASES = [
    ("iterations-1e30", "ppo", {"iterations": "1e30"}, ["iterations (1e+30) must be <= 1,000,000,000"]),
    ("batch-1e18", "sft", {"batch_size": "1e18"}, ["batch_size (1e+18) must be <= 1,000,000,000"]),
    ("batch-memory", "sft", {"batch_size": "1e9"},
     ["batch_size (1000000000) needs ~", "GiB for its batch's token tensors alone", "lower batch_size"]),
    ("warmup-1e30", "grpo", {"warmup_steps": "1e30"}, ["warmup_steps (1e+30) must be <= 1,000,000,000"]),
    ("warmup-never-reached", "grpo", {"warmup_steps": "1e5"},
     ["warmup_steps (100,000) is more than 100x the run's 2 optimiser steps: the lr would peak at ~"]),
    ("warmup-never-reached-sft", "sft", {"warmup_steps": "1000"},
     ["warmup_steps (1,000) is more than 100x the run's 1 optimiser steps"]),
    ("planned-steps", "grpo", {"iterations": "1e8"},
     ["iterations (100,000,000) x 2 optimiser steps an iteration plans 200,000,000 optimiser steps, more than "
      "10,000,000"]),
    ("epochs", "dpo", {"epochs": "1e8", "max_steps": "null"}, ["epochs (100,000,000) plans", "more than 10,000,000"]),
    ("lora-layers", "sft", {"lora_layers": "999"},
     ["lora_layers (999) is more than the model's 2 transformer layers: use 1 .. 2"]),
    ("lora-layers-rm", "rm", {"lora_layers": "3"}, ["lora_layers (3) is more than the model's 2 transformer layers"]),
    ("nul-bytes", "ppo", {"prompts": "{in}/nul.txt"}, ["{in}/nul.txt:2: a NUL byte (byte 19): not a text file"]),
    ("one-json-object", "grpo", {"prompts": "{in}/one_object.json"},
     ["{in}/one_object.json: expected a JSON list of records, got one object (keys: prompt)"]),
    ("surrogate-yaml", "grpo", {"_yaml": "{in}/surrogate.yaml"},
     ["{in}/surrogate.yaml:2: system_prompt: not valid Unicode (a lone surrogate \\ud800 at character 4)"]),
    ("byte-ff-argv", "sft", {"system_prompt": "be\udcffkind"},
     ["system_prompt: not valid Unicode (byte 0xff is not UTF-8 at character 3)"]),
    ("byte-ff-list", "ppo", {"lora_target_modules": "q_proj,\udcff"},
     ["lora_target_modules: not valid Unicode (byte 0xff is not UTF-8 at character 1)"]),
]


@pytest.fixture(scope="module")
def bad_inputs(inputs):  # noqa: F811
    for name, data in BAD_FILES.items():
        (inputs / name).write_bytes(data)
    return inputs


@pytest.mark.parametrize("command, overrides, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_runaway_or_nonsense_input_is_one_line(command, overrides, expected, bad_inputs, work, tiny_model_dir,  # noqa: F811
                                               capsys):
    rc = run_cli(command, bad_inputs, tiny_model_dir, overrides)
    assert_clean_error(rc, capsys.readouterr().err, [e.replace("{in}", str(bad_inputs)) for e in expected], work)


@pytest.mark.parametrize("variable, value, expected", [
    ("OMP_NUM_THREADS", "abc", "OMP_NUM_THREADS='abc' (environment): expected a whole number >= 1; fix or unset it"),
    ("ACCELERATE_MIXED_PRECISION", "fp13",
     "ACCELERATE_MIXED_PRECISION='fp13' (environment): expected one of no, fp16, bf16, fp8"),
    ("WORLD_SIZE", "0", "WORLD_SIZE='0' (environment): expected a whole number >= 1"),
])
def test_a_bad_environment_value_is_one_line_naming_the_variable(variable, value, expected, inputs, work,  # noqa: F811
                                                                 tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setenv(variable, value)
    rc = run_cli("sft", inputs, tiny_model_dir, {})
    assert_clean_error(rc, capsys.readouterr().err, [expected], work)


def test_a_short_warm_up_is_one_warning_and_the_run_goes_on(inputs, work, tiny_model_dir, capsys):  # noqa: F811
    rc = run_cli("sft", inputs, tiny_model_dir, {"warmup_steps": "8"})
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("rlhfkit: warning: warmup")]
    assert rc == 0
    assert warnings == ["rlhfkit: warning: warmup_steps (8) is more than the run's 1 optimiser steps: the lr peaks at "
                        "~2.5e-05, not lr=0.0002 (lower warmup_steps to reach it)"]


def test_a_json_object_of_columns_is_a_table_as_datasets_reads_it(tmp_path):
    from rlhfkit.data.readers import read_records

    path = tmp_path / "cols.json"
    path.write_text(json.dumps({"prompt": ["a", "b"], "answer": ["1", "2"]}))
    assert list(read_records(str(path))) == [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]


class CountingTokenizer:
    """The tiny tokenizer, recording the longest text it was asked to encode."""

    def __init__(self, tok):
        self.tok, self.longest = tok, 0

    def __call__(self, texts, **kwargs):
        self.longest = max([self.longest] + [len(t) for t in ([texts] if isinstance(texts, str) else texts)])
        return self.tok(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tok, name)


def test_a_huge_prompt_costs_the_tokenizer_only_its_kept_end(tiny_tokenizer):
    """A 1 MB prompt is cut in characters before it is tokenised (no tokenizer call sees more than a
    few times the kept part), and the tokens kept are the last `limit` tokens of the whole text."""
    from rlhfkit.rollout.prompt_fit import encode_prompts, enforce_prompt_limit

    limit = 40
    huge = "".join(f"word{i % 97} and more, " for i in range(50_000))  # ~1 MB
    full = tiny_tokenizer(huge, add_special_tokens=False)["input_ids"]
    tiny_tokenizer.padding_side = "left"
    counting = CountingTokenizer(tiny_tokenizer)
    assert enforce_prompt_limit(counting, [(["short", huge], None)], limit, "truncate_left") == 1
    enc = encode_prompts(counting, ["short", huge], limit)
    assert enc["input_ids"][1].tolist() == full[-limit:]
    assert enc["attention_mask"][0].sum().item() == len(tiny_tokenizer("short", add_special_tokens=False)["input_ids"])
    assert counting.longest <= 8 * 4 * (limit + 17), counting.longest  # a tail, never the megabyte


def test_every_config_problem_of_a_command_line_and_yaml_file_is_in_one_line(bad_inputs, work, tiny_model_dir,  # noqa: F811
                                                                             capsys):
    """Unknown keys, values of the wrong type and failed checks, from the command line and a YAML
    file: all named in one message, exit 2, nothing written (each used to stop the run alone)."""
    (bad_inputs / "two_problems.yaml").write_text("itertions: 3\nlr: fast\n")
    rc = run_cli("grpo", bad_inputs, tiny_model_dir, {"_yaml": "{in}/two_problems.yaml", "lrr": "1",
                                                      "group_size": "1.5", "top_p": "5", "seed": "-1"})
    yaml_file = bad_inputs / "two_problems.yaml"
    assert_clean_error(rc, capsys.readouterr().err, [
        f"6 problems: {yaml_file}: unknown config key 'itertions' (did you mean 'iterations'?); "
        f"{yaml_file}: lr='fast': expected float (a finite number); "
        "group_size=1.5: expected int; command line: unknown config key 'lrr' (did you mean 'lr'?); "
        "seed (-1) must be in [0, 2**63 - 1]; top_p (5.0) must be in (0, 1]"], work)


def test_a_directly_built_config_names_every_problem_too():
    from rlhfkit.errors import ConfigError
    from rlhfkit.trainers.sft_config import SFTConfig

    with pytest.raises(ConfigError) as err:
        SFTConfig(lrr=1, batch_size=3, micro_batch_size=2, epochs="many")
    assert str(err.value) == ("3 problems: SFTConfig: unknown config key 'lrr' (did you mean 'lr'?); "
                              "SFTConfig: epochs='many': expected int; "
                              "batch_size (3) must be divisible by micro_batch_size (2)")
