"""One command grammar: every command of the registry (rlhfkit.commands.COMMANDS) prints its --help
(exit 0, a usage line first) and reads an option given as `key=value` and as `--key value` alike."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.commands import COMMANDS, command_main, load
from rlhfkit.core.argv import flag_argv, pair_argv, parse_command_line
from rlhfkit.core.command_line import parse_values
from rlhfkit.errors import ConfigError

# argparse commands: (arguments the parser requires, an option, a value, the attribute it sets)
ARGPARSE_EXAMPLES = {
    "generate": (["--prompt", "hi"], "max-new-tokens", "7", "max_new_tokens"),
    "export": (["runs/a", "--out", "o"], "push-to-hub", "org/name", "push_to_hub"),
    "selfcheck": ([], "break", "clip", "breaks"),
    "serve-reward": (["sentiment"], "max-batch", "16", "max_batch"),
    "serve": ([], "port", "8123", "port"),
    "doctor": (["runs/a"], "min-severity", "warning", "min_severity"),
    "report": (["runs/a"], "samples", "2", "samples"),
    "label": (["export", "--pairs", "p.jsonl", "--out", "o.jsonl"], "ties", "keep-as-half", "ties"),
}


def config_option(cls: type) -> tuple[str, str]:
    """An option of a config class with a value to give it: `seed` where there is one."""
    names = [f.name for f in dataclasses.fields(cls)]
    return ("seed", "3") if "seed" in names else (names[0], "x")


def parsed_both_ways(name: str) -> tuple[object, object]:
    cmd = COMMANDS[name]
    if cmd.config:
        cls = load(cmd.config)
        key, value = config_option(cls)
        first = parse_values(cls, [f"{key}={value}"], f"rlhfkit {name}")[0][key]
        return first, parse_values(cls, [f"--{key}", value], f"rlhfkit {name}")[0][key]
    if cmd.parser:
        required, key, value, dest = ARGPARSE_EXAMPLES[name]
        parser = load(cmd.parser)
        first = getattr(parse_command_line(parser(), [*required, f"{key}={value}"]), dest)
        return first, getattr(parse_command_line(parser(), [*required, f"--{key}", value]), dest)
    from rlhfkit.commands.pipeline import load_pipeline_config

    assert name == "pipeline", f"{name}: give the registry its config or parser"
    return (load_pipeline_config(pair_argv(["seed=3"]))["seed"],
            load_pipeline_config(pair_argv(["--seed", "3"]))["seed"])


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_exits_0_with_a_usage_line(name, capsys):
    try:
        code = command_main(name)(["--help"])
    except SystemExit as e:  # argparse's --help
        code = e.code
    assert code in (0, None)
    assert capsys.readouterr().out.startswith(f"usage: rlhfkit {name}")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_key_value_and_flag_value_read_alike(name):
    first, second = parsed_both_ways(name)
    assert first == second and first not in (None, "", [], False)


def test_flag_argv_leaves_values_and_switches_to_argparse():
    p = argparse.ArgumentParser(prog="rlhfkit x")
    p.add_argument("--prompt", action="append")
    p.add_argument("--model-generation-config", action="store_true")
    assert flag_argv(["--prompt", "a=b", "prompt=c", "model_generation_config=true"], p) == [
        "--prompt", "a=b", "--prompt", "c", "--model-generation-config"]
    assert flag_argv(["model-generation-config=no"], p) == []


def test_an_unknown_key_is_one_line_with_the_closest_option():
    p = argparse.ArgumentParser(prog="rlhfkit x")
    p.add_argument("--max-new-tokens", type=int)
    with pytest.raises(ConfigError, match=r"^rlhfkit x: unknown option 'max_new_token' \(did you mean max_new_tokens=\?\)"):
        flag_argv(["max_new_token=3"], p)


def test_pair_argv_spells_flags_as_pairs():
    assert pair_argv(["c.yaml", "--seed", "3", "--sft.lr=1e-4", "--quiet", "ppo.iterations=2"]) == [
        "c.yaml", "seed=3", "sft.lr=1e-4", "quiet=true", "ppo.iterations=2"]


def test_a_config_command_reads_its_command_line_without_loading_torch():
    """Every config-driven command (the trainers, eval, tpo, ...) prints --help and refuses a mistyped
    option before its code (torch, transformers) is imported: both answer in a fraction of a second."""
    names = [name for name, cmd in COMMANDS.items() if cmd.config and not cmd.main]
    script = (
        "import contextlib, io, sys\n"
        "from rlhfkit.commands import command_main\n"
        "from rlhfkit.errors import UserError\n"
        f"for name in {names!r}:\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "        assert command_main(name)(['--help']) == 0\n"
        "    assert out.getvalue().startswith('usage: rlhfkit ' + name), name\n"
        "    try:\n"
        "        command_main(name)(['no_such_option=1'])\n"
        "    except UserError as e:\n"
        "        assert 'no_such_option' in str(e), e\n"
        "    else:\n"
        "        raise AssertionError(name + ' took an unknown option')\n"
        "print(sorted(m for m in ('torch', 'transformers', 'accelerate', 'peft') if m in sys.modules))\n")
    src = Path(__file__).resolve().parents[1] / "src"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert len(names) >= 15 and done.stdout.strip() == "[]", done.stdout
