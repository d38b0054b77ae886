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
import shutil
import subprocess
from pathlib import Path

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.commands import COMMANDS, load

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
    return load(COMMANDS[command].config)


def test_the_path_has_numbered_entries_each_with_code_test_and_experiment():
    """Entries 0, 1, 2, ... in page order, one numbering: each numbered page's file name starts with the
    number of its first entry and its title names its entries."""
    entries = re.findall(r"^## (\d+)\. (.+)$", all_text(), re.M)
    assert 20 <= len(entries) <= 40 and [int(n) for n, _ in entries] == list(range(len(entries)))
    for page in PAGES:
        numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", page.read_text(encoding="utf-8"), re.M)]
        if not numbers:
            assert not page.name[0].isdigit(), f"{page.name}: a numbered page without entries"
            continue
        assert page.name[:2] == f"{numbers[0]:02d}", f"{page.name} holds entries {numbers}"
        title = page.read_text(encoding="utf-8").splitlines()[0]
        span = f"(entry {numbers[0]})" if len(numbers) == 1 else f"(entries {numbers[0]}-{numbers[-1]})"
        assert title.startswith("# ") and title.endswith(span), (page.name, title)
    for page in PAGES:
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
    text = page_text("21-defaults-and-beyond.md")
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
    ("healthy", 0, set(), "19-reading-a-run.md"),
    ("unhealthy", 1, {"policy_clip_frac", "approx_kl_high", "rollout_kl_high"}, "19-reading-a-run.md"),
    ("epochs4", 0, {"policy_clip_frac", "approx_kl_high"}, "14-the-update.md"),
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


# ----------------------------------------------------------------------------- what the pages say about the shipped runs

SHIPPED = ("healthy", "unhealthy", "epochs4")
SHIPPED_WITH = "03945d3"  # the commit whose code recorded (and added) the shipped runs


def _metric(name: str, key: str) -> list[float]:
    rows = (LEARN / "examples" / name / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(row)[key] for row in rows if row.strip()]


def test_the_shipped_runs_are_labelled_with_their_dtype_and_commit():
    """The pages name the dtype each shipped run's config.yaml records and the commit that recorded it;
    where the git history is at hand, that commit is the one that added the runs."""
    dtypes = {re.search(r"^dtype: (\w+)$", (LEARN / "examples" / n / "config.yaml").read_text(), re.M).group(1)
              for n in SHIPPED}
    assert dtypes == {"bf16"}
    readme = page_text("README.md")
    assert "in **bf16** (`dtype: bf16`" in readme and f"commit {SHIPPED_WITH}" in readme
    for name in ("19-reading-a-run.md", "21-defaults-and-beyond.md"):
        text = " ".join(page_text(name).split())
        assert "in bf16" in text and f"with the code of commit {SHIPPED_WITH}" in text, name
    assert "(fp32)" not in all_text()
    git = shutil.which("git")
    if git and (ROOT / ".git").exists():
        out = subprocess.run([git, "log", "--format=%h", "--", "docs/learn/examples/healthy"], cwd=ROOT,
                             capture_output=True, text=True, check=False).stdout.split()
        if out:  # a shallow clone may not hold the commit
            assert out[-1].startswith(SHIPPED_WITH) or SHIPPED_WITH.startswith(out[-1])


def test_the_first_finding_of_the_unhealthy_run_is_the_one_the_page_names(capsys):
    """`doctor --all` lists findings as they fired: approx_kl_high at iteration 0 comes first, while the
    default view puts the clip fraction's warning at iteration 2 (its worst)."""
    run = str(LEARN / "examples" / "unhealthy")
    assert cli_main(["doctor", run, "--all", "--json"]) == 1
    first = json.loads(capsys.readouterr().out)[0]
    assert (first["rule"], first["severity"], first["iteration"]) == ("approx_kl_high", "warning", 0)
    text = " ".join(page_text("19-reading-a-run.md").split())
    assert "the first sign came at iteration 0, from the size of the very first update (`approx_kl_high`" in text
    assert "rlhfkit doctor docs/learn/examples/unhealthy --all" in text
    total = _metric("unhealthy", "loss/total")
    assert f"went from {min(total):.3f} to {max(total):.3f}" in text


def test_the_stop_fractions_the_page_gives_are_the_runs():
    assert set(_metric("healthy", "rollout/stop_fraction")) <= {0.0, 0.125}
    unhealthy = _metric("unhealthy", "rollout/stop_fraction")
    assert unhealthy[:3] == [0.125, 0.375, 0.25] and set(unhealthy[3:]) == {0.0}
    text = " ".join(page_text("09-advantages.md").split())
    assert "0 or 0.125 at every iteration of the healthy run" in text and "0.125, 0.375, 0.25 and is 0 from iteration 3" in text


def test_the_kl_budget_the_defaults_page_gives_is_the_doctors():
    """Entry 21: 6-14 nats can average past the budget and draw a warning, never a critical finding."""
    from rlhfkit.diagnostics import Thresholds, diagnose

    t = Thresholds()
    text = " ".join(page_text("21-defaults-and-beyond.md").split())
    assert f"budget of {t.rollout_kl_warn:g}" in text and f"critical only past {t.rollout_kl_critical:g}" in text
    rows = [{"iteration": i, "rollout/kl": kl} for i, kl in enumerate([7.0, 9.0, 11.0, 13.0, 12.0])]
    found = [f for f in diagnose(rows) if f.rule == "rollout_kl_high"]
    assert found and {f.severity for f in found} == {"warning"}  # (11 + 13 + 12) / 3 = 12 > 10


def test_the_kl_module_cites_a_test_file_that_exists():
    import rlhfkit.algos.kl as kl

    cited = re.findall(r"tests/[\w/]+\.py", kl.__doc__)
    assert cited and all((ROOT / path).is_file() for path in cited)


def test_the_break_page_prints_what_selfcheck_prints(capsys):
    """Entry 30's output blocks are lines `rlhfkit selfcheck --break` prints (its '...' elides lines)."""
    text = page_text("30-break-it-yourself.md")
    names = re.findall(r"--break ([\w-]+)", text.split("```bash", 1)[1].split("```", 1)[0])
    assert len(names) >= 3
    assert cli_main(["selfcheck", *[a for n in names for a in ("--break", n)]]) == 0
    printed = {" ".join(line.split()) for line in capsys.readouterr().out.splitlines()}
    shown = [b for lang, b in BLOCK.findall(text) if lang == "text"]
    lines = [" ".join(ln.split()) for block in shown for ln in block.splitlines() if ln.strip() not in ("", "...")]
    # the counter [i/n] depends on how many breaks one command ran, and a float-error figure's digits on the
    # order of the CPU's sums (its thread count: 7.15e-07 on one thread, 3.46e-06 on two); the rest must match
    noise = re.compile(r"right: (\S+) \(float error\)")
    figures = [float(m) for p in printed for m in noise.findall(p)]
    assert figures and all(f < 1e-4 for f in figures)  # noise, well under ratio_check_tol

    def same(line: str) -> str:
        return noise.sub("right: <float error> (float error)", re.sub(r"^\[\d+/\d+\]", "", line))

    missing = [ln for ln in lines if same(ln) not in {same(p) for p in printed}]
    assert not missing, missing


def test_the_metric_table_is_the_doctors_mapping():
    """glossary.md's metric table: every rlhfkit name is a documented metric, and every TRL name is the one
    `rlhfkit doctor` maps to it when it reads a TRL log."""
    from rlhfkit.diagnostics.foreign import TRL_PPO
    from rlhfkit.diagnostics.glossary import METRICS

    text = page_text("glossary.md")
    table = text[text.index("| rlhfkit | TRL (PPO) | OpenRLHF (PPO) |") :].split("\n\n")[0]
    rows = re.findall(r"^\| `([\w/]+)` \| (`[\w/]+`|-) \| (`[\w/]+`|-) \|", table, re.M)
    assert len(rows) >= 10
    for ours, trl, _ in rows:
        assert ours in METRICS, ours
        if trl != "-":
            assert TRL_PPO[trl.strip("`")][0] == ours, (trl, ours)
    assert {trl.strip("`") for _, trl, _ in rows} >= set(TRL_PPO)  # every name the doctor maps is in the table
