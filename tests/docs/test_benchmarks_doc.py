"""docs/benchmarks.md holds one current section per bench script, each naming the date, commit, machine, versions
and command of its figures; bench/benchdoc.py's writer replaces a bench's block instead of adding to the page."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(ROOT / "bench"))
import benchdoc  # noqa: E402

FIELDS = ("Date", "Commit", "Machine", "Versions", "Command")  # what each block says, in this order
FIELD_LINES = re.compile("".join(rf"- {field}: .+\n" for field in FIELDS))
BLOCK = re.compile(r"<!-- ([\w-]+):start -->\n(.*?)<!-- \1:end -->", re.S)


def sections(text: str) -> dict[str, str]:
    """'## heading' -> the section's text up to the next '## ' heading."""
    parts = re.split(r"^## (.+)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def bench_scripts() -> list[str]:
    return sorted(p.name for p in (ROOT / "bench").glob("*.py") if p.name != "benchdoc.py")


def test_every_bench_script_has_exactly_one_section():
    headings = list(sections(DOC.read_text(encoding="utf-8")))
    counts = {script: sum(f"bench/{script}" in h for h in headings) for script in bench_scripts()}
    assert {s: n for s, n in counts.items() if n != 1} == {}
    named = {m for h in headings for m in re.findall(r"bench/([\w.]+\.py)", h)}
    assert named <= set(bench_scripts()), named - set(bench_scripts())


def test_every_bench_section_names_date_commit_machine_versions_and_command():
    for heading, body in sections(DOC.read_text(encoding="utf-8")).items():
        if "bench/" not in heading:
            continue
        assert FIELD_LINES.search(body), f"{heading}: no date/commit/machine/versions/command lines"
        for name, block in BLOCK.findall(body):
            assert FIELD_LINES.match(block), f"{heading}: block {name} does not open with its provenance lines"


def test_no_bench_section_keeps_a_superseded_run():
    text = DOC.read_text(encoding="utf-8")
    assert len(BLOCK.findall(text)) == len(set(BLOCK.findall(text)))
    for phrase in ("Re-measured", "its block was replaced", "Figures kept from the earlier runs", "A second run after"):
        assert phrase not in text, phrase


def test_a_run_replaces_its_block_and_leaves_the_rest(tmp_path):
    doc = tmp_path / "benchmarks.md"
    before = DOC.read_text(encoding="utf-8")
    doc.write_text(before)
    command = "python bench/growth.py --axis size --points 135m --threads 1"
    benchdoc.write_block("growth_size", "Growth with model size (bench/growth.py)", "| model |\n| 135m |", doc=doc,
                         command=command)
    after = doc.read_text()
    block = dict(BLOCK.findall(after))["growth_size"]
    assert FIELD_LINES.match(block) and f"- Command: `{command}`" in block and block.endswith("| 135m |\n")
    assert "| 1.7b |" not in after and after.count("<!-- growth_size:start -->") == 1
    assert list(sections(after)) == list(sections(before))
    old = dict(BLOCK.findall(before))["growth_size"]
    assert after.replace(block, "") == before.replace(old, "")
    benchdoc.write_block("growth_size", "Growth with model size (bench/growth.py)", "| model |\n| 360m |", doc=doc,
                         command=command)
    assert "| 135m |" not in doc.read_text() and "| 360m |" in doc.read_text()


def test_a_new_block_of_a_bench_goes_into_its_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Growth (bench/growth.py)\n\nintro\n\n## Other (bench/gpu.py)\n\nx\n")
    benchdoc.write_block("growth_depth", "Growth with depth (bench/growth.py)", "| depth |", doc=doc, command="c")
    text = doc.read_text()
    assert list(sections(text)) == ["Growth (bench/growth.py)", "Other (bench/gpu.py)"]
    assert "<!-- growth_depth:start -->" in sections(text)["Growth (bench/growth.py)"]
    benchdoc.write_block("knobs", "Memory and speed knobs (bench/bench_knobs.py)", "| k |", doc=doc, command="c")
    assert list(sections(doc.read_text()))[-1] == "Memory and speed knobs (bench/bench_knobs.py)"


def test_a_table_measured_elsewhere_keeps_its_own_provenance(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    lines = "\n".join(f"- {field}: from the GPU machine" for field in FIELDS)
    benchdoc.write_block("gpu_bench", "GPU (bench/gpu.py)", f"{lines}\n\n| part |", doc=doc)
    benchdoc.write_block("bench_head", "Head (bench/bench_head.py)", "| case |", doc=doc)
    blocks = dict(BLOCK.findall(doc.read_text()))
    assert blocks["gpu_bench"] == f"{lines}\n\n| part |\n"
    assert FIELD_LINES.match(blocks["bench_head"]) and "from the GPU machine" not in blocks["bench_head"]


def test_the_gpu_bench_brings_the_gpu_machine_s_provenance():
    import gpu

    doc = {"machine": "NVIDIA H200 (139 GiB), CUDA 13.0, torch 2.11.0+cu130, transformers 5.24.0, Python 3.12.3, "
                      "2026-11-28, commit abc1234", "command": "python bench/gpu.py --save-json x.json"}
    assert gpu.doc_provenance(doc).splitlines() == [
        "- Date: 2026-11-28", "- Commit: abc1234", "- Machine: NVIDIA H200 (139 GiB), CUDA 13.0",
        "- Versions: torch 2.11.0+cu130, transformers 5.24.0, Python 3.12.3",
        "- Command: `python bench/gpu.py --save-json x.json`"]


def test_the_writer_and_the_doc_name_the_same_fields():
    assert benchdoc.FIELDS == FIELDS


def test_the_command_line_is_written_from_the_repository_root():
    argv = [str(ROOT / "bench" / "growth.py"), "--axis", "size", "--points", "135m,1.7b"]
    assert benchdoc.command_text(argv) == "python bench/growth.py --axis size --points 135m,1.7b"
