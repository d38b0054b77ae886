"""docs/pitfalls.md names the sixteen correctness pitfalls; code, docs and tests link to a pitfall by
its heading's anchor. These tests keep those references honest: the page has exactly the sixteen
headings in order, every link into the page names one of them, and every function, option and test
the page names exists in the tree as it is now."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "pitfalls.md"
NAMES = (
    "temperature", "padding-and-positions", "pad-equals-eos", "off-by-one", "score-placement", "dropout",
    "whitening", "masked-gae", "value-head-init", "kl-estimators", "loss-aggregation", "adam-warmup",
    "eos-policy", "lora-reference", "metric-definitions", "seeds-per-process",
)
PARTS = ("**What goes wrong.**", "**What rlhfkit does.**", "**Options:**", "**Code:**", "**Tests:**")
CONFIGS = ("ppo_config:PPOConfig", "grpo_config:GRPOConfig", "grpo_config:RLOOConfig", "dpo_config:DPOConfig",
           "rm_config:RMConfig", "sft_config:SFTConfig")

HEADING = re.compile(r"^## (.*)$", re.MULTILINE)
LINK = re.compile(r"pitfalls\.md#([^\s)\]>`'\",:;.]*)")  # the anchor after the page's file name and '#'
PAGE_LINK = re.compile(r"\]\(#([^)]*)\)")  # [name](#name) inside the page
TEST_PATH = re.compile(r"\btests/[\w/]+\.py\b")
TEST_REF = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")
CODE_REF = re.compile(r"(?<![\w/.])rlhfkit(?:\.[A-Za-z_]\w*)+")  # rlhfkit.pkg.module.function
OPTIONS = re.compile(r"^\*\*Options:\*\*(.*?)(?:\n\n|\Z)", re.MULTILINE | re.DOTALL)
SCANNED = ("src", "docs", "tests", "README.md")


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def sections(text: str) -> dict[str, str]:
    """Heading -> the text up to the next `## ` heading."""
    cuts = list(HEADING.finditer(text))
    return {m.group(1): text[m.end() : (cuts[i + 1].start() if i + 1 < len(cuts) else len(text))]
            for i, m in enumerate(cuts)}


def resolve(dotted: str) -> object:
    """The object `dotted` names: the longest importable module prefix, then attributes.
    Raises ImportError/AttributeError when it does not exist."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name is None or not module_name.startswith(e.name):  # a real import error inside the module
                raise
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module in {dotted!r}")


@cache
def collected_tests(path: str) -> frozenset[str]:
    """Names pytest would collect as tests in `path`: module-level test_* functions and test_*
    methods of Test* classes."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    names = {n.name for n in tree.body if isinstance(n, funcs)}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
        names |= {n.name for n in cls.body if isinstance(n, funcs)}
    return frozenset(n for n in names if n.startswith("test"))


def config_fields() -> set[str]:
    fields = set()
    for spec in CONFIGS:
        module, cls = spec.split(":")
        config = getattr(importlib.import_module(f"rlhfkit.trainers.{module}"), cls)
        fields |= {f.name for f in dataclasses.fields(config)}
    return fields


def scanned_files() -> list[Path]:
    files = []
    for entry in SCANNED:
        path = ROOT / entry
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [f for f in files if "__pycache__" not in f.parts and f.suffix not in (".pyc", ".png", ".gz", ".parquet")]


# ----------------------------------------------------------------------------- the page


def test_the_page_has_exactly_the_sixteen_headings_in_order():
    text = page()
    assert tuple(HEADING.findall(text)) == NAMES
    assert len(text.splitlines()[0]) > 2 and text.startswith("# "), "one title line first"
    for name in NAMES:  # GitHub's anchor of a heading that is already lower-case and hyphenated is itself
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", name), name


@pytest.mark.parametrize("name", NAMES)
def test_every_section_says_what_goes_wrong_the_rule_the_option_the_code_and_the_tests(name):
    body = sections(page())[name]
    positions = [body.find(part) for part in PARTS]
    assert all(p >= 0 for p in positions), f"{name}: missing {[PARTS[i] for i, p in enumerate(positions) if p < 0]}"
    assert positions == sorted(positions), f"{name}: parts out of order"
    code, tests = body[positions[3] : positions[4]], body[positions[4] :]
    assert CODE_REF.search(code), f"{name}: **Code:** names no rlhfkit function"
    assert TEST_REF.search(tests), f"{name}: **Tests:** names no tests/...py::test_name"


def test_pitfalls_are_named_never_numbered():
    assert not re.search(r"pitfall\s*#?\s*\(?\d", page(), re.IGNORECASE)


# ----------------------------------------------------------------------------- links into the page


def test_every_link_to_the_page_names_one_of_its_headings():
    found, bad = 0, []
    for f in scanned_files():
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        targets = [(m.start(), m.group(1)) for m in LINK.finditer(text)]
        if f == PAGE:
            targets += [(m.start(), m.group(1)) for m in PAGE_LINK.finditer(text)]
        for pos, name in targets:
            found += 1
            if name not in NAMES:
                bad.append(f"{f.relative_to(ROOT)}:{text.count(chr(10), 0, pos) + 1}: #{name}")
    assert not bad, "links to no heading of docs/pitfalls.md:\n" + "\n".join(bad)
    assert found >= 5, "the scan found no links: is the pattern still right?"


def test_the_link_check_sees_a_wrong_name():
    """The pattern catches both link forms, with the name as its group."""
    page_md = "pitfalls.md"  # spelled apart so that the repository scan does not read these as links
    text = f"see docs/{page_md}#off-by-one and [x](../{page_md}#off-by-two)."
    assert [m.group(1) for m in LINK.finditer(text)] == ["off-by-one", "off-by-two"]
    assert [m.group(1) for m in PAGE_LINK.finditer("[a](#whitening), [b](#nope)")] == ["whitening", "nope"]


# ----------------------------------------------------------------------------- names on the page


def test_every_test_named_on_the_page_exists():
    text = page()
    refs = sorted(set(TEST_REF.findall(text)))
    assert len(refs) >= len(NAMES)
    missing_files = sorted({p for p in TEST_PATH.findall(text) if not (ROOT / p).is_file()})
    assert not missing_files, f"no such test file: {missing_files}"
    missing = [f"{path}::{name}" for path, name in refs if name not in collected_tests(path)]
    assert not missing, "no such test:\n" + "\n".join(missing)


def test_every_function_named_on_the_page_exists():
    names = sorted(set(CODE_REF.findall(page())))
    assert len(names) >= len(NAMES)
    missing = []
    for dotted in names:
        try:
            resolve(dotted)
        except (ImportError, AttributeError) as e:
            missing.append(f"{dotted}: {type(e).__name__}: {e}")
    assert not missing, "named on docs/pitfalls.md but not in the code:\n" + "\n".join(missing)


def test_resolve_tells_a_missing_function_from_an_existing_one():
    assert resolve("rlhfkit.algos.masks.response_mask").__name__ == "response_mask"
    assert resolve("rlhfkit.models.policy.ActorCritic.forward").__qualname__ == "ActorCritic.forward"
    with pytest.raises(AttributeError):
        resolve("rlhfkit.algos.masks.no_such_function")
    with pytest.raises(AttributeError):  # rlhfkit.trainers imports; it has no such module
        resolve("rlhfkit.trainers.no_such_module.function")


def test_every_option_named_on_the_page_is_a_trainer_config_field():
    fields = config_fields()
    named = [tok for block in OPTIONS.findall(page()) for tok in re.findall(r"`([a-z_][a-z0-9_]*)`", block)]
    assert len(named) >= 10
    unknown = sorted(set(named) - fields)
    assert not unknown, f"options on docs/pitfalls.md that no trainer config has: {unknown}"


def test_no_file_refers_to_numbering_a_reader_cannot_follow():
    """Pitfalls are named (a heading of docs/pitfalls.md) and the design documents outside the repository are
    not cited by number: neither "pitfall 4" nor "seed 002" may appear in code, tests or docs."""
    pattern = re.compile(r"\bpitfalls? \d|\bseeds? 00\d|\bseed-00\d|\bseed_00\d", re.IGNORECASE)
    offenders = []
    for path in [*ROOT.glob("src/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("bench/**/*.py"),
                 *ROOT.glob("docs/**/*.md"), ROOT / "README.md"]:
        if path.resolve() == Path(__file__).resolve():
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not offenders, "\n".join(offenders)
