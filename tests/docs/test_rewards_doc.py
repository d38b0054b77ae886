"""docs/rewards.md: every reward kind has a section with an example, every example command line is a valid
configuration of its command, and the verl and OpenRLHF functions it shows run unchanged."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from rlhfkit.commands import COMMANDS, load
from rlhfkit.core.command_line import parse_values
from rlhfkit.core.config import build_config
from rlhfkit.rewards import get_reward, score_batch
from rlhfkit.rewards.registry import BUILTINS, KINDS, _as_specs

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "rewards.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", DOC, re.S | re.M)
NOT_HERE = ("code",)  # reward=code and its task set arrive with the sandbox


def example_commands() -> list[list[str]]:
    """Every `rlhfkit TRAINER ...` line of the bash blocks, as argv (comments and env assignments dropped)."""
    out = []
    for lang, body in BLOCKS:
        for line in body.splitlines() if lang == "bash" else []:
            words = shlex.split(line.split(" #")[0].rstrip(" &"))
            words = words[next(i for i, w in enumerate(words) if "=" not in w or w.startswith("reward")):]
            if words and words[0] == "rlhfkit" and COMMANDS.get(words[1], None) and COMMANDS[words[1]].config:
                out.append(words[1:])
    return out


def test_every_reward_kind_has_a_section_with_an_example():
    headings = re.findall(r"^## (.+)$", DOC, re.M)
    for kind in [*BUILTINS, *KINDS, "code"]:
        word = {"https": "http", "model": "model:", "python": "python:", "judge": "judge:"}.get(kind, kind)
        assert any(word.lower() in h.lower() for h in headings), kind
        assert re.search(rf"reward={re.escape(kind)}\b", DOC) or kind == "https", kind


@pytest.mark.parametrize("argv", example_commands(), ids=lambda a: " ".join(a)[:60])
def test_example_commands_are_valid_configurations(argv):
    cls = load(COMMANDS[argv[0]].config)
    values, sources = parse_values(cls, argv[1:], f"rlhfkit {argv[0]}")
    cfg = build_config(cls, values, sources=sources)
    if not hasattr(cfg, "reward"):  # the reward model's training, `rlhfkit rm`
        return
    for spec in _as_specs(cfg.reward):
        kind = spec.partition(":")[0]
        assert kind in BUILTINS or kind in KINDS or kind in NOT_HERE, spec
    if cfg.reward_weights is not None:
        assert len(cfg.reward_weights) == len(_as_specs(cfg.reward))


def test_there_are_examples_of_the_remote_kinds():
    text = " ".join(" ".join(a) for a in example_commands())
    for fragment in ("reward=http://", "reward=judge:", "reward=verl:", "reward=openrlhf:", "reward_weights=1,0.2"):
        assert fragment in text, fragment


@pytest.mark.parametrize("name, spec", [("verl_reward.py", "verl:{f}"), ("openrlhf_reward.py", "openrlhf:{f}")])
def test_the_peer_functions_shown_run_unchanged(name, spec, tmp_path):
    from rlhfkit.data.prompts import load_prompts

    code = next(body for lang, body in BLOCKS if lang == "python" and body.startswith(f"# {name}"))
    (tmp_path / name).write_text(code)
    record = load_prompts("builtin:arithmetic")[0]  # answer '15 + 6 = 21\n#### 21'
    right = str(record["answer_value"])
    fn = get_reward(spec.format(f=tmp_path / name))
    scores = score_batch(fn, [record["prompt"]] * 2, [f"It is {right}", "It is 0"], {"answer": [record["answer"]] * 2})
    assert scores == [1.0, 0.0]
