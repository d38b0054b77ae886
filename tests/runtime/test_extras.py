"""The optional extras in pyproject.toml: vLLM's version range against the releases' own torch pins,
no declared extra that nothing uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
# torch==X that each vLLM release requires (its wheel's metadata on the package registry, 2026-11-23).
VLLM_TORCH = {"0.22.0": "2.11.0", "0.24.0": "2.11.0", "0.25.0": "2.11.0", "0.26.0": "2.11.0", "0.27.0": "2.13.0",
              "0.29.0": "2.13.0", "0.31.0": "2.13.0", "0.33.0": "2.14.0"}


def requirement(extra: str, name: str) -> Requirement:
    reqs = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"][extra]]
    return next(r for r in reqs if r.name == name)


def test_vllm_range_holds_exactly_the_checked_releases_built_on_a_torch_rlhfkit_accepts():
    vllm = requirement("vllm", "vllm").specifier
    torch = next(Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch")).specifier
    assert {op for op in (s.operator for s in vllm)} == {">=", "<"}, "a range: a floor and a cap"
    inside = {v for v in VLLM_TORCH if vllm.contains(v)}
    assert inside == {v for v, t in VLLM_TORCH.items() if torch.contains(t)}
    cap = Version(next(s.version for s in vllm if s.operator == "<"))
    assert max(map(Version, VLLM_TORCH)) < cap, "releases past the newest checked one stay out"


def test_every_extra_is_used_by_the_code():
    src = Path(__file__).resolve().parents[2] / "src" / "rlhfkit"
    code = "\n".join(p.read_text() for p in src.rglob("*.py"))
    modules = {"data": "datasets", "tensorboard": "torch.utils.tensorboard", "wandb": "wandb", "plots": "matplotlib",
               "vllm": "vllm", "judge": "openai", "openenv": "websockets"}
    extras = set(PYPROJECT["project"]["optional-dependencies"]) - {"dev", "bench"}
    assert extras == set(modules), "a new extra needs an entry here"
    for extra, module in modules.items():
        assert re.search(rf"^\s*(from|import) {re.escape(module)}\b", code, flags=re.M), extra
