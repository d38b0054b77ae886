"""tests/ mirrors src/rlhfkit/: each test folder is named after the package it tests; a few folders
test what no single package holds (named below with why), and the test files at the top level check
rules that span every package."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "src" / "rlhfkit"
# Folders that test something other than one package, and why.
NOT_A_PACKAGE = {
    "docs": "the documentation's claims, figures and links",
    "scale": "multi-process runs (FSDP2, DDP, resume under several processes) across every trainer",
}
# Top-level test files: rules over the whole package, not one package's behaviour.
WHOLE_PACKAGE = {
    "test_bad_input.py", "test_bad_input_bounds.py", "test_command_grammar.py", "test_config_contract.py", "test_fuzz_inputs.py",
    "test_gpu.py", "test_layout.py", "test_source_rules.py", "test_tests_layout.py",
}


def test_every_test_folder_names_a_package():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert packages and folders
    stray = folders - packages - NOT_A_PACKAGE.keys()
    assert not stray, f"test folders that name no package of src/rlhfkit: {sorted(stray)}"


def test_top_level_test_files_are_whole_package_rules():
    top = {p.name for p in TESTS.glob("test_*.py")}
    assert "test_layout.py" in top
    loose = top - WHOLE_PACKAGE
    assert not loose, (f"{sorted(loose)} test one package: move them under tests/<package>/ "
                       "(or, for a rule over every package, add them to WHOLE_PACKAGE with a reason)")
