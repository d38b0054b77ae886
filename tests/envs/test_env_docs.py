"""docs/environments.md stays true: its example environment runs as the page shows, and every
function, option and command it names exists."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from rlhfkit.commands import COMMANDS, load
from rlhfkit.data.prompts import load_prompts
from rlhfkit.envs import as_step, make_env_factory

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "environments.md"
BLOCK = re.compile(r"^ *```(\w*)\n(.*?)^ *```", re.S | re.M)


def blocks(lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(PAGE.read_text(encoding="utf-8")) if kind == lang]


def shown_episode() -> list[tuple[str, str, str]]:
    """The example episode on the page: (role, content, annotation) per message."""
    (text,) = [b for b in blocks("text") if b.startswith("system")]
    messages: list[list[str]] = []
    for line in text.splitlines():  # an 11-character role column; continuation lines leave it blank
        role, rest = line[:11].strip(), line[11:]
        content, note = (re.split(r"\s{2,}(?=reward )", rest) + [""])[:2]
        if role:
            messages.append([role, content.rstrip(), note])
        else:
            messages[-1][1] += "\n" + content.rstrip()
    return [tuple(m) for m in messages]


@pytest.fixture()
def shop(tmp_path, monkeypatch):
    (code,) = [b for b in blocks("python") if b.startswith('"""shop_env.py')]
    (data,) = [b for b in blocks("json") if '"prompt"' in b]
    (tmp_path / "shop_env.py").write_text(code)
    (tmp_path / "shop.jsonl").write_text(data)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_example_environment_plays_the_episode_the_page_shows(shop):
    make = make_env_factory("shop_env.py:ShopEnv")
    assert make.prompts == "shop.jsonl"
    records = load_prompts(make.prompts)
    assert [(r["item"], r["count"]) for r in records] == [("apple", 3), ("pear", 2)]
    want = shown_episode()
    env = make()
    history = env.reset(records[0])
    rewards = []
    for role, content, _note in want[len(history):]:
        if role == "assistant":
            history.append({"role": role, "content": content})
            obs, reward, done = as_step(env.step(list(history), content))
            rewards.append((reward, done))
            history += obs or []
    assert [(m["role"], m["content"]) for m in history] == [(r, c) for r, c, _ in want]
    assert rewards == [(None, False), (1.0, True)]
    assert [n for _, _, n in want if n] == ["reward None", "reward 1.0, done"]


def test_the_example_tool_refuses_what_the_shop_does_not_sell(shop):
    env = make_env_factory("shop_env.py:ShopEnv")()
    history = env.reset({"prompt": "How many coins do 2 pears cost?", "item": "pear", "count": 2})
    obs, reward, done = as_step(env.step(history, "<price>kiwi</price>"))
    assert obs == [{"role": "user", "content": "Tool result: error: the shop sells no 'kiwi'"}]
    assert (reward, done) == (None, False)
    assert tuple(as_step(env.step(history, "8"))) == (None, 1.0, True)


def test_the_json_format_example_calls_the_calculator():
    from rlhfkit.envs.calculator import CALCULATOR
    from rlhfkit.envs.tools import JSON, TAG, call_tool, parse_tool_call

    tag, json_call = (b.strip() for b in blocks("text") if b.strip().startswith("<"))
    for text, fmt in ((tag, TAG), (json_call, JSON)):
        assert call_tool(parse_tool_call(text, fmt), [CALCULATOR]).text == "84"


def test_named_functions_exist():
    names = set(re.findall(r"`(rlhfkit(?:\.\w+)+)`", PAGE.read_text(encoding="utf-8")))
    assert len(names) >= 8
    for name in sorted(names):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                assert hasattr(obj, attr), f"{name}: {'.'.join(parts[:i])} has no {attr}"
                obj = getattr(obj, attr)
            break


def test_named_commands_and_options_exist():
    lines = [ln for b in blocks("bash") for ln in b.splitlines() if ln.startswith("rlhfkit ")]
    assert len(lines) >= 4
    for line in lines:
        command, *args = line.split("#")[0].split()[1:]
        fields = {f.name for f in dataclasses.fields(load(COMMANDS[command].config))}
        for arg in args:
            assert arg.split("=")[0] in fields, f"rlhfkit {command}: no option {arg}"
    text = PAGE.read_text(encoding="utf-8")
    for option in re.findall(r"^\| `(\w+)` \|", text, re.M):
        assert all(option in {f.name for f in dataclasses.fields(load(COMMANDS[c].config))} for c in ("grpo", "ppo"))
