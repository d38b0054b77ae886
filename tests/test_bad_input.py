"""Bad input through the real entry point (`rlhfkit.cli.main`), one table row per case.

Every row must end with exit code 2, exactly one `rlhfkit: error: ...` line on stderr that names
what is wrong and where, no traceback, and nothing written: no run folder, no output file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlhfkit.cli import main

from tiny_lm import build_tiny_model, build_tokenizer

QUICK = {
    "ppo": ["reward=length:3", "iterations=1", "rollout_batch_size=4", "mini_batch_size=2", "micro_batch_size=2",
            "max_new_tokens=4", "num_eval_prompts=0", "dtype=fp32", "quiet=true", "tensorboard=false"],
    "grpo": ["reward=length:3", "iterations=1", "rollout_batch_size=4", "group_size=2", "mini_batch_size=4",
             "micro_batch_size=2", "max_new_tokens=4", "num_eval_prompts=0", "dtype=fp32", "quiet=true",
             "tensorboard=false"],
    "sft": ["max_steps=1", "batch_size=2", "micro_batch_size=2", "dtype=fp32", "quiet=true", "tensorboard=false"],
    "rm": ["max_steps=1", "batch_size=2", "micro_batch_size=2", "dtype=fp32", "quiet=true", "tensorboard=false"],
    "dpo": ["max_steps=1", "batch_size=2", "micro_batch_size=2", "dtype=fp32", "quiet=true", "tensorboard=false",
            "num_eval_prompts=0"],
    "eval": ["num_prompts=null", "rewards=[length:3]", "max_new_tokens=4", "dtype=fp32", "rouge=false"],
    "prefs": ["scorer=length:3", "max_new_tokens=4", "dtype=fp32", "k=2"],
}
# The data option of each command, and the input file it reads by default in these tests.
DATA_KEY = {"ppo": "prompts", "grpo": "prompts", "eval": "prompts", "prefs": "prompts", "sft": "data", "rm": "data",
            "dpo": "prefs"}
DEFAULT_DATA_OF = {"ppo": "prompts.txt", "grpo": "prompts.txt", "eval": "prompts.txt", "prefs": "prompts.txt",
                   "sft": "sft.jsonl", "rm": "prefs.jsonl", "dpo": "prefs.jsonl"}
LONG = "word " * 600  # ~2400 tokens with the tiny tokenizer; its model has 256 positions


def _jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


INPUTS = {
    "prompts.txt": "\n".join(f"Write a review of thing {i}." for i in range(8)),
    "sft.jsonl": _jsonl({"prompt": f"q {i}", "response": f"a {i}"} for i in range(8)),
    "prefs.jsonl": _jsonl({"prompt": f"q {i}", "chosen": f"good {i}", "rejected": f"bad {i}"} for i in range(8)),
    "empty.jsonl": "",
    "blank.jsonl": "\n  \n\n",
    "bad.jsonl": '{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c",}\n',
    "nofield.jsonl": _jsonl([{"text": "a", "id": 1}, {"text": "b", "id": 2}]),
    "nocol.csv": "text,id\nhello,1\nworld,2\n",
    "wrongtype.jsonl": _jsonl([{"prompt": "a"}, {"prompt": 5}]),
    "test_only.jsonl": _jsonl({"prompt": f"p {i}", "split": "test"} for i in range(4)),
    "sft_noresponse.jsonl": _jsonl({"prompt": f"q {i}", "answer": f"a {i}"} for i in range(4)),
    "sft_test_only.jsonl": _jsonl({"prompt": f"q {i}", "response": "a", "split": "test"} for i in range(4)),
    "prefs_norejected.jsonl": _jsonl({"prompt": f"q {i}", "chosen": f"c {i}"} for i in range(4)),
    "prefs_badmargin.jsonl": _jsonl([{"prompt": "q", "chosen": "a", "rejected": "b", "margin": "big"}]),
    "long.jsonl": _jsonl([{"prompt": "short one"}, {"prompt": LONG}] + [{"prompt": f"p {i}"} for i in range(6)]),
    "prefs_long.jsonl": _jsonl({"prompt": LONG if i == 1 else f"q {i}", "chosen": f"good {i}",
                                "rejected": f"bad {i}"} for i in range(8)),
    "bad_key.yaml": "lr: 1e-3\nitertions: 3\n",
    "dup_key.yaml": "lr: 1e-4\nlr: 5\n",
    "dup_key.jsonl": '{"prompt": "a"}\n{"prompt": "b", "prompt": "c"}\n',
    "surrogate.jsonl": '{"prompt": "a"}\n{"prompt": "x\\ud800y"}\n',
    "bad_value.yaml": "lr: fast\n",
    "broken.yaml": "lr: [1,\n",
    "a_file.txt": "not a model\n",
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir) -> Path:
    """Input files and model folders, outside the working directory the commands run in."""
    root = tmp_path_factory.mktemp("inputs")
    for name, text in INPUTS.items():
        (root / name).write_text(text)
    (root / "empty_dir").mkdir()
    tok = build_tokenizer()
    tok.chat_template = None
    build_tiny_model(len(tok)).save_pretrained(root / "no_chat")
    tok.save_pretrained(root / "no_chat")
    from transformers import DistilBertConfig

    DistilBertConfig(vocab_size=64, dim=16, n_layers=1, n_heads=2, hidden_dim=32).save_pretrained(root / "encoder")
    (root / "no_tokenizer").mkdir()
    for name in ("config.json", "model.safetensors"):  # a model without tokenizer files
        shutil.copy(tiny_model_dir / name, root / "no_tokenizer")
    shutil.copytree(tiny_model_dir, root / "corrupt")
    (root / "corrupt" / "model.safetensors").write_bytes(b"\x10\x00garbage")
    return root


@pytest.fixture()
def work(tmp_path, monkeypatch) -> Path:
    """An empty working directory: default outputs (runs/, prefs.jsonl) would land here."""
    path = tmp_path / "work"
    path.mkdir()
    monkeypatch.chdir(path)
    return path


def run_cli(command: str, inputs: Path, model: Path, overrides: dict) -> int:
    """`rlhfkit COMMAND model=... DATA=... <quick settings> <overrides>`; {in} in values = inputs folder."""
    key = DATA_KEY[command]
    values = {"model": str(model), key: str(inputs / DEFAULT_DATA_OF[command])}
    values.update({k: str(v).replace("{in}", str(inputs)) for k, v in overrides.items()})
    head = ["prefs", "make"] if command == "prefs" else [command]
    yaml_files = [values.pop("_yaml")] if "_yaml" in values else []
    argv = head + yaml_files + QUICK[command] + [f"{k}={v}" for k, v in values.items()]
    return main(argv)


def assert_clean_error(rc: int, err: str, expected: list[str], work: Path) -> None:
    """Exit 2, one `rlhfkit: error:` line holding every expected fragment, no traceback, no files."""
    lines = [ln for ln in err.splitlines() if ln.startswith("rlhfkit:")]
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("rlhfkit: error: "), err
    for fragment in expected:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    left = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    assert not left, f"left behind: {left}"


# (case id, command, overrides, fragments the message must hold; {in} = the inputs folder)
CASES = [
    # configuration: unknown keys, types, choices, ranges
    ("unknown-key", "ppo", {"lrr": "1e-3"}, ["unknown config key 'lrr'", "did you mean 'lr'?"]),
    ("unknown-key-yaml", "ppo", {"_yaml": "{in}/bad_key.yaml"},
     ["{in}/bad_key.yaml: unknown config key 'itertions'", "did you mean 'iterations'?"]),
    ("bad-value-yaml", "sft", {"_yaml": "{in}/bad_value.yaml"}, ["{in}/bad_value.yaml: lr='fast': expected float"]),
    ("invalid-yaml", "rm", {"_yaml": "{in}/broken.yaml"}, ["{in}/broken.yaml:2: invalid YAML"]),
    ("duplicate-key-yaml", "sft", {"_yaml": "{in}/dup_key.yaml"},
     ["{in}/dup_key.yaml:2: invalid YAML (key 'lr' given twice (first on line 1))"]),
    ("duplicate-key-jsonl", "ppo", {"prompts": "{in}/dup_key.jsonl"},
     ["{in}/dup_key.jsonl:2: key 'prompt' given twice in one object"]),
    ("lone-surrogate", "grpo", {"prompts": "{in}/surrogate.jsonl"}, ["{in}/surrogate.jsonl:2: not valid Unicode"]),
    ("rollout-too-big", "grpo", {"rollout_batch_size": "1e9"},
     ["rollout_batch_size (1000000000) needs ~", "GiB for its rollout tensors alone", "lower rollout_batch_size"]),
    ("stop-ids-vocabulary", "grpo", {"stop_ids": "5,100000"},
     ["stop_ids ([5, 100000]) must be token ids of the model's vocabulary (0 .. "]),
    ("seed-range", "ppo", {"seed": "1e23"}, ["seed (99999999999999991611392) must be in [0, 2**63 - 1]"]),
    ("output-dir-file", "sft", {"output_dir": "{in}/a_file.txt"}, ["output_dir: {in}/a_file.txt is a file, not a folder"]),
    ("run-name-outside", "grpo", {"run_name": "../x"}, ["run_name (../x) must be a folder name inside output_dir"]),
    ("missing-yaml", "dpo", {"_yaml": "{in}/nope.yaml"}, ["config file not found: {in}/nope.yaml"]),
    ("int", "ppo", {"iterations": "1.5"}, ["iterations=1.5: expected int"]),
    ("bool", "grpo", {"quiet": "maybe"}, ["quiet='maybe': expected bool"]),
    ("list-of-int", "ppo", {"stop_ids": "abc"}, ["stop_ids='abc': expected list[int]"]),
    ("nan", "ppo", {"lr": "nan"}, ["lr='nan': expected float"]),
    ("choice", "ppo", {"loss_agg": "sum"}, ["loss_agg='sum': expected one of token-mean, seq-mean"]),
    ("code-reward-choice", "grpo", {"code_reward": "most"}, ["code_reward='most': expected one of fraction, all"]),
    ("code-workers", "grpo", {"code_workers": "0"}, ["code_workers (0) must be >= 1"]),
    ("code-timeout", "ppo", {"code_timeout": "0"}, ["code_timeout (0.0) must be a number of seconds > 0"]),
    ("code-memory", "grpo", {"code_memory_mb": "10"}, ["code_memory_mb (10) must be >= 64"]),
    ("code-spec", "grpo", {"reward": "code:most"}, ["reward 'code:most': expected 'code', 'code:fraction' or 'code:all'"]),
    ("code-no-tests", "grpo", {"reward": "code"}, ["reward 'code' needs a tests column", "tests_field="]),
    ("code-tests-field", "grpo", {"reward": "code", "tests_field": "checks"},
     ["reward 'code' needs tests_field='checks'"]),
    ("lr-ppo", "ppo", {"lr": "0"}, ["lr (0.0) must be > 0"]),
    ("lr-grpo", "grpo", {"lr": "-1"}, ["lr (-1.0) must be > 0"]),
    ("lr-sft", "sft", {"lr": "0"}, ["lr (0.0) must be > 0"]),
    ("lr-rm", "rm", {"lr": "0"}, ["lr (0.0) must be > 0"]),
    ("lr-dpo", "dpo", {"lr": "0"}, ["lr (0.0) must be > 0"]),
    ("clip-eps", "ppo", {"clip_eps": "0"}, ["clip_eps (0.0) must be > 0"]),
    ("temperature", "grpo", {"temperature": "0"}, ["temperature (0.0) must be > 0"]),
    ("temperature-eval", "eval", {"temperature": "-1"}, ["temperature (-1.0) must be >= 0"]),
    ("top-k", "ppo", {"top_k": "-1"}, ["top_k (-1) must be >= 0"]),
    ("max-grad-norm", "sft", {"max_grad_norm": "0"}, ["max_grad_norm (0.0) must be > 0"]),
    ("warmup", "dpo", {"warmup_steps": "-2"}, ["warmup_steps (-2) must be >= 0"]),
    ("lora-r", "rm", {"lora_r": "0"}, ["lora_r (0) must be >= 1"]),
    ("k", "prefs", {"k": "1"}, ["k (1) must be >= 2"]),
    ("divisible", "ppo", {"rollout_batch_size": "5"},
     ["rollout_batch_size (5) must be divisible by mini_batch_size (2)"]),
    ("divisible-group", "grpo", {"rollout_batch_size": "5"},
     ["rollout_batch_size (5) must be divisible by group_size (2)"]),
    ("divisible-sft", "sft", {"batch_size": "3"}, ["batch_size (3) must be divisible by micro_batch_size (2)"]),
    ("lora-targets", "ppo", {"lora_target_modules": "nope"},
     ["lora_target_modules: no linear layer named 'nope'", "q_proj"]),
    ("context", "ppo", {"max_new_tokens": "300"},
     ["max_new_tokens (300) must be < the model's context window of 256 tokens"]),
    ("prompt-limit", "eval", {"max_prompt_length": "250", "max_new_tokens": "8"},
     ["max_prompt_length (250) + max_new_tokens (8) must be <= the model's context window of 256 tokens"]),
    # data: missing, empty, malformed, missing or mistyped fields
    *[(f"missing-file-{c}", c, {DATA_KEY[c]: "{in}/nope.jsonl"}, ["{in}/nope.jsonl: no such file or directory"])
      for c in ("ppo", "grpo", "sft", "rm", "dpo", "eval", "prefs")],
    *[(f"empty-{c}", c, {DATA_KEY[c]: "{in}/empty.jsonl"}, ["{in}/empty.jsonl: no records found"])
      for c in ("ppo", "sft", "rm", "dpo", "eval", "prefs")],
    ("blank-lines", "sft", {"data": "{in}/blank.jsonl"}, ["{in}/blank.jsonl: no records found"]),
    ("no-train-split", "ppo", {"prompts": "{in}/test_only.jsonl"},
     ["{in}/test_only.jsonl: no records with split 'train' (found: test)"]),
    ("no-train-split-sft", "sft", {"data": "{in}/sft_test_only.jsonl"}, ["{in}/sft_test_only.jsonl: no training records"]),
    *[(f"malformed-{c}", c, {DATA_KEY[c]: "{in}/bad.jsonl"}, ["{in}/bad.jsonl:3: invalid JSON"])
      for c in ("ppo", "sft", "rm", "dpo", "eval", "prefs")],
    ("csv-column", "ppo", {"prompts": "{in}/nocol.csv"},
     ["{in}/nocol.csv:2: missing field 'prompt' (expected one of: prompt, messages); found: text, id"]),
    ("missing-prompt", "grpo", {"prompts": "{in}/nofield.jsonl"},
     ["{in}/nofield.jsonl:1: missing field 'prompt'", "found: text, id"]),
    ("missing-response", "sft", {"data": "{in}/sft_noresponse.jsonl"},
     ["{in}/sft_noresponse.jsonl:1: missing field 'response' (expected one of: response, completion, messages); "
      "found: prompt, answer"]),
    ("missing-rejected-rm", "rm", {"data": "{in}/prefs_norejected.jsonl"},
     ["{in}/prefs_norejected.jsonl:1: missing field 'rejected'; found: prompt, chosen"]),
    ("missing-rejected-dpo", "dpo", {"prefs": "{in}/prefs_norejected.jsonl"},
     ["{in}/prefs_norejected.jsonl:1: missing field 'rejected'"]),
    ("field-type", "ppo", {"prompts": "{in}/wrongtype.jsonl"},
     ["{in}/wrongtype.jsonl:2: field 'prompt' must be a string, got a number"]),
    ("margin-type", "rm", {"data": "{in}/prefs_badmargin.jsonl"},
     ["{in}/prefs_badmargin.jsonl:1: field 'margin' must be a number, got 'big'"]),
    # prompts longer than the context window, prompt_overflow=error
    *[(f"long-prompt-{c}", c, {"prompts": "{in}/long.jsonl", "prompt_overflow": "error"},
       ["{in}/long.jsonl:2: prompt 2 is", "tokens after formatting, more than the limit of 252",
        "context window 256 - max_new_tokens 4", "prompt_overflow=truncate_left"])
      for c in ("ppo", "grpo", "eval")],
    ("long-prompt-prefs", "prefs", {"prompts": "{in}/long.jsonl", "prompt_overflow": "error"},
     ["{in}/long.jsonl: prompt 2 is", "more than the limit of 252"]),
    ("long-prompt-dpo", "dpo", {"prefs": "{in}/prefs_long.jsonl", "prompt_overflow": "error"},
     ["{in}/prefs_long.jsonl:2: prompt 2 is", "more than the limit of 192 (max_prompt_length=192)"]),
    # model paths that are not a causal LM
    *[(f"no-model-{c}", c, {"model": "{in}/nope"}, ["model '{in}/nope' not found", "a Hub id (org/name[@revision])"])
      for c in ("ppo", "sft", "eval")],
    *[(f"empty-dir-{c}", c, {"model": "{in}/empty_dir"},
       ["{in}/empty_dir is not a causal LM folder: no config.json"]) for c in ("grpo", "dpo", "prefs")],
    ("model-is-file", "rm", {"model": "{in}/a_file.txt"}, ["model: {in}/a_file.txt is a file, not a causal LM folder"]),
    *[(f"encoder-{c}", c, {"model": "{in}/encoder"}, ["{in}/encoder holds a 'distilbert' model, not a causal LM"])
      for c in ("ppo", "sft", "dpo", "eval", "prefs")],
    ("no-tokenizer", "ppo", {"model": "{in}/no_tokenizer"}, ["{in}/no_tokenizer: could not load its tokenizer"]),
    ("corrupt-weights", "eval", {"model": "{in}/corrupt"}, ["{in}/corrupt: could not load a causal LM"]),
    # a chat template asked for explicitly, and the tokenizer has none
    *[(f"chat-template-{c}", c, {"model": "{in}/no_chat", "chat_template": "true"},
       ["chat_template=true, but the tokenizer of {in}/no_chat has no chat template",
        "set chat_template=false", "'User: ...\\n\\nAssistant: '"])
      for c in ("ppo", "grpo", "sft", "rm", "dpo", "eval", "prefs")],
]


@pytest.mark.parametrize("command, overrides, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(command, overrides, expected, inputs, work, tiny_model_dir,
                                                         capsys):
    rc = run_cli(command, inputs, tiny_model_dir, overrides)
    err = capsys.readouterr().err
    assert_clean_error(rc, err, [e.replace("{in}", str(inputs)) for e in expected], work)


def test_case_ids_are_unique():
    ids = [c[0] for c in CASES]
    assert len(ids) == len(set(ids))


# --------------------------------------------------------------------------- --debug

DEBUG_COMMANDS = ["ppo", "grpo", "sft", "rm", "dpo", "eval", "prefs"]


@pytest.mark.parametrize("command", DEBUG_COMMANDS)
def test_debug_flag_shows_the_traceback_and_keeps_exit_2(command, inputs, work, tiny_model_dir, capsys):
    key = DATA_KEY[command]
    head = ["prefs", "make"] if command == "prefs" else [command]
    argv = ["--debug", *head, *QUICK[command], f"model={tiny_model_dir}", f"{key}={inputs / 'nope.jsonl'}"]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback (most recent call last)" in err and "DataError" in err
    assert err.strip().splitlines()[-1] == f"rlhfkit: error: {inputs / 'nope.jsonl'}: no such file or directory"


@pytest.mark.parametrize("value, shown", [("1", True), ("yes", True), ("0", False), ("", False), ("false", False)])
def test_rlhfkit_debug_environment_variable(value, shown, inputs, work, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("RLHFKIT_DEBUG", value)
    rc = run_cli("sft", inputs, tiny_model_dir, {"data": "{in}/nope.jsonl"})
    err = capsys.readouterr().err
    assert rc == 2 and ("Traceback" in err) is shown


def test_generate_command_bad_model_is_one_line(inputs, work, capsys):
    rc = main(["generate", "--model", str(inputs / "encoder"), "--prompt", "hi"])
    assert_clean_error(rc, capsys.readouterr().err, ["holds a 'distilbert' model, not a causal LM"], work)


# --------------------------------------------------------------------------- prompts that are too long

def test_long_prompts_are_cut_from_the_left_with_one_warning(inputs, work, tiny_model_dir, capsys):
    rc = run_cli("eval", inputs, tiny_model_dir, {"prompts": "{in}/long.jsonl", "out_dir": "out"})
    err = capsys.readouterr().err
    warnings = [ln for ln in err.splitlines() if ln.startswith("rlhfkit: warning:")]
    assert rc == 0
    assert warnings == ["rlhfkit: warning: 1 of 8 prompts are longer than 252 tokens (the model's context window "
                        "256 - max_new_tokens 4) and lose their beginning (prompt_overflow=truncate_left; "
                        "prompt_overflow=error stops instead)"]
    assert len((work / "out" / "samples.jsonl").read_text().splitlines()) == 8


def test_generate_keeps_the_last_max_prompt_length_tokens(tiny_model_dir):
    from rlhfkit.models import load_causal_lm, load_tokenizer
    from rlhfkit.rollout import SamplingParams, generate

    tok = load_tokenizer(str(tiny_model_dir))
    model = load_causal_lm(str(tiny_model_dir), trainable=False)
    texts = ["short", "a much longer prompt that has many more tokens than the limit " * 3]
    full = tok(texts, add_special_tokens=False)["input_ids"]
    out = generate(model, tok, texts, SamplingParams(max_new_tokens=2, temperature=0, max_prompt_length=10))
    assert out.query_ids.shape[1] == 10
    assert out.query_ids[1].tolist() == full[1][-10:]  # the end of the long prompt
    assert out.query_ids[0][out.query_mask[0].bool()].tolist() == full[0]  # the short one is whole


def test_context_window_and_prompt_limit():
    from types import SimpleNamespace as NS

    from rlhfkit.errors import ConfigError
    from rlhfkit.rollout.prompt_fit import context_window, prompt_token_limit

    assert context_window(NS(config=NS(n_positions=1024))) == 1024  # GPT-2 names it differently
    assert context_window(NS(config=NS(max_position_embeddings=256, n_positions=9))) == 256
    assert context_window(NS(config=NS())) is None and prompt_token_limit(NS(config=NS()), 48) == (None, "")
    model = NS(config=NS(max_position_embeddings=100))
    assert prompt_token_limit(model, 20) == (80, "the model's context window 100 - max_new_tokens 20")
    assert prompt_token_limit(model, 20, 50) == (50, "max_prompt_length=50")
    with pytest.raises(ConfigError, match=r"^max_new_tokens \(100\) must be < the model's context window of 100"):
        prompt_token_limit(model, 100)


# --------------------------------------------------------------------------- config details

def test_config_values_keep_their_text_and_name_their_yaml_file(tmp_path):
    from rlhfkit.core.command_line import parse_args
    from rlhfkit.errors import ConfigError
    from rlhfkit.trainers.ppo_config import PPOConfig

    cfg = parse_args(PPOConfig, ["run_name=007", "system_prompt=yes", "stop_ids=1,2", "lora_target_modules=q_proj"],
                     "t")
    assert (cfg.run_name, cfg.system_prompt, cfg.stop_ids, cfg.lora_target_modules) == ("007", "yes", [1, 2], ["q_proj"])
    path = tmp_path / "c.yaml"
    path.write_text("stop_ids: [1, two]\n")
    with pytest.raises(ConfigError) as err:
        parse_args(PPOConfig, [str(path)], "t")
    assert str(err.value) == f"{path}: stop_ids=[1, 'two']: expected list[int]"
    path.write_text("1: x\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: unknown config key '1'$"):
        parse_args(PPOConfig, [str(path)], "t")
    path.write_bytes(b"lr: \xff\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: not a UTF-8 text file \(byte 4\)$"):
        parse_args(PPOConfig, [str(path)], "t")
    path.write_text("lr: 2001-13-45\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: cannot read the config \(ValueError: month must be in 1\.\.12\)"):
        parse_args(PPOConfig, [str(path)], "t")


@pytest.mark.parametrize("cache, expected", [
    ("{in}/a_file.txt", "RLHFKIT_CACHE: {in}/a_file.txt is a file, not a folder; set RLHFKIT_CACHE to a writable folder"),
    ("{in}/a_file.txt/sub", "RLHFKIT_CACHE: {in}/a_file.txt is a file, not a folder"),
], ids=["file", "below-a-file"])
def test_an_unusable_model_cache_is_one_line(cache, expected, inputs, work, monkeypatch, capsys):
    """The default model is materialised into RLHFKIT_CACHE: a cache that cannot be a folder is one
    line before anything loads (not a traceback from mkdir)."""
    monkeypatch.setenv("RLHFKIT_CACHE", cache.replace("{in}", str(inputs)))
    rc = run_cli("sft", inputs, "smollm2-135m-instruct", {})
    assert_clean_error(rc, capsys.readouterr().err, [expected.replace("{in}", str(inputs))], work)
