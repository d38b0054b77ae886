"""The learning path (docs/learn/) stays true to the code: every snippet prints what the page says,
every command, option, function and test it names exists, every link resolves inside the
repository, the defaults table holds PPOConfig's defaults, and the shipped example runs get the
findings the page describes."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import math
import re
from pathlib import Path

import pytest

from rlhfkit.cli import COMMANDS
from rlhfkit.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
LEARN = ROOT / "docs" / "learn"
PAGES = sorted(LEARN.glob("*.md"))
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:e[-+]?\d+)?")
PITFALLS = ("temperature padding-and-positions pad-equals-eos off-by-one score-placement dropout whitening "
            "masked-gae value-head-init kl-estimators loss-aggregation adam-warmup eos-policy lora-reference "
            "metric-definitions seeds-per-process").split()
TRAINERS = ("ppo", "sft", "rm", "dpo", "grpo", "rloo")


def snippets(text: str) -> list[tuple[str, str]]:
    """(python code, expected output) for every python block followed directly by a text block."""
    blocks = [(m.group(1), m.group(2), m.start(), m.end()) for m in BLOCK.finditer(text)]
    return [(code, out) for (lang, code, _, end), (lang2, out, start2, _) in zip(blocks, blocks[1:])
            if lang == "python" and lang2 == "text" and not text[end:start2].strip()]


def run_snippet(code: str) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__"})  # noqa: S102
    return buffer.getvalue()


def same_output(got: str, want: str, rel: float = 2e-3) -> bool:
    """Equal text with numbers equal to `rel` of max(1, |want|) (the last printed digit may differ
    between CPUs: AVX2 and AVX-512 sum in different orders)."""
    g, w = got.strip().splitlines(), want.strip().splitlines()
    if len(g) != len(w):
        return False
    for gl, wl in zip(g, w):
        if NUMBER.sub("#", gl).split() != NUMBER.sub("#", wl).split():
            return False
        for a, b in zip(NUMBER.findall(gl), NUMBER.findall(wl)):
            if abs(float(a) - float(b)) > rel * max(1.0, abs(float(b))):
                return False
    return True


def page_text(name: str) -> str:
    return (LEARN / name).read_text(encoding="utf-8")


def all_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in PAGES)


def config_class(command: str):
    module = importlib.import_module(COMMANDS[command][0].split(":")[0])
    return getattr(module, f"{command.upper()}Config")


def test_the_path_has_15_to_25_entries_each_with_code_test_and_experiment():
    entries = re.findall(r"^## (\d+)\. (.+)$", all_text(), re.M)
    assert 15 <= len(entries) <= 25 and [int(n) for n, _ in entries] == list(range(1, len(entries) + 1))
    for page in PAGES[1:]:
        for section in re.split(r"^## \d+\. ", page.read_text(encoding="utf-8"), flags=re.M)[1:]:
            title = section.splitlines()[0]
            assert "**Answer.**" in section and "**Try it.**" in section, title
            assert "**Code:**" in section and re.search(r"\*\*Tests?:\*\* `tests/", section), title
    index = page_text("README.md")
    assert all(title in index.replace("\\|", "|") for _, title in entries)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_snippet_prints_what_the_page_shows(page):
    found = snippets(page.read_text(encoding="utf-8"))
    for code, want in found:
        assert want.strip(), f"{page.name}: a snippet without its output:\n{code}"
        got = run_snippet(code)
        assert same_output(got, want), f"{page.name}: the snippet\n{code}\nprints\n{got}\nnot\n{want}"


def test_named_functions_exist():
    names = set(re.findall(r"`(rlhfkit(?:\.\w+)+)`", all_text()))
    assert len(names) >= 20
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
        else:
            pytest.fail(f"{name}: no such module")


def test_named_tests_exist():
    refs = set(re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", all_text()))
    assert len(refs) >= 20
    for path, name in sorted(refs):
        file = ROOT / path
        assert file.is_file(), path
        assert re.search(rf"^def {name}\(", file.read_text(encoding="utf-8"), re.M), f"{path}::{name}"


def _commands() -> list[list[str]]:
    """Every `rlhfkit ...` line in a bash block and every inline `rlhfkit ...` span, as argv."""
    text = all_text()
    lines = [ln for lang, body in BLOCK.findall(text) if lang == "bash" for ln in body.splitlines()]
    lines += re.findall(r"`(rlhfkit [^`]+)`", text)
    return [ln.split("#")[0].split()[1:] for ln in lines if ln.startswith("rlhfkit ")]


def test_named_commands_and_options_exist(capsys):
    commands = _commands()
    assert len(commands) >= 10
    for argv in commands:
        command = argv[0]
        assert command in COMMANDS, argv
        if command in TRAINERS:
            fields = {f.name for f in dataclasses.fields(config_class(command))}
            for arg in argv[1:]:
                if "=" in arg:
                    assert arg.split("=")[0] in fields, f"rlhfkit {command}: no option {arg.split('=')[0]}"
            continue
        with contextlib.suppress(SystemExit):  # argparse exits after --help; config_main returns
            cli_main([command, "--help"])
        helptext = capsys.readouterr().out
        for arg in argv[1:]:
            if arg.startswith("--"):
                assert arg in helptext, f"rlhfkit {command}: no option {arg}"
    options = set(re.findall(r"`([a-z_]+)=[^`\s]+`", all_text()))  # inline `key=value` (a bare `name=` is a function argument)
    every = set().union(*({f.name for f in dataclasses.fields(config_class(c))} for c in TRAINERS))
    assert options and options <= every, sorted(options - every)


def test_links_stay_inside_the_repository_and_resolve():
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert "http://" not in text and "https://" not in text, page.name
        assert not re.search(r"seed[ _-]?0\d\d|pitfall \d", text, re.I), page.name
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if file.name == "pitfalls.md":  # the page of named pitfalls (written alongside this one)
                assert not anchor or anchor in PITFALLS, target
                if file.exists():
                    assert anchor in file.read_text(encoding="utf-8"), target
                continue
            assert file.exists() and ROOT in file.parents, f"{page.name}: {target}"
            if anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)
                assert anchor in {slug(h) for h in headings}, f"{page.name}: {target}"


def slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading: lowercase, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_defaults_table_is_ppoconfigs():
    text = page_text("06-defaults-and-beyond.md")
    table = text[text.index("| option | default | why |") :].split("\n\n")[0]
    defaults = {f.name: f.default for f in dataclasses.fields(config_class("ppo"))}
    rows = re.findall(r"^\| (`[^|]+) \| ([^|]+) \|", table, re.M)
    assert len(rows) >= 12
    for names, values in rows:
        keys = re.findall(r"`(\w+)`", names)
        shown = [v.strip() for v in values.split(",")]
        assert len(keys) == len(shown), names
        for key, value in zip(keys, shown):
            want = defaults[key]
            if isinstance(want, bool) or want is None or isinstance(want, str):
                assert value == {True: "true", False: "false", None: "none"}.get(want, want), (key, value)
            else:
                assert math.isclose(float(value), float(want)), (key, value, want)


@pytest.mark.parametrize("name,exit_status,rules,page", [
    ("healthy", 0, set(), "05-reading-a-run.md"),
    ("unhealthy", 1, {"policy_clip_frac", "approx_kl_high", "rollout_kl_high"}, "05-reading-a-run.md"),
    ("epochs4", 0, {"policy_clip_frac", "approx_kl_high"}, "04-the-update.md"),
])
def test_the_shipped_runs_get_the_findings_the_page_describes(name, exit_status, rules, page, capsys):
    run = LEARN / "examples" / name
    assert (run / "metrics.jsonl").is_file() and (run / "config.yaml").is_file()
    assert cli_main(["doctor", str(run), "--json"]) == exit_status
    found = json.loads(capsys.readouterr().out)
    serious = {f["rule"] for f in found if f["severity"] != "info"}
    assert rules <= serious and (rules or not serious), serious
    text = page_text(page)
    assert f"docs/learn/examples/{name}" in text and all(f"`{r}`" in text for r in rules)
