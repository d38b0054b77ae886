"""Thresholds are overridable and validated; docs/diagnostics.md documents every rule, threshold
(with its actual default) and metric."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from rlhfkit.diagnostics import RULES, Thresholds
from rlhfkit.diagnostics.glossary import METRICS
from rlhfkit.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "diagnostics.md"

CONTRACT_METRICS = """
rollout/reward_mean rollout/reward_std rollout/score_mean rollout/kl rollout/response_length
rollout/stop_fraction rollout/entropy loss/policy loss/value loss/entropy loss/total
params/policy_clip_frac params/value_clip_frac params/approx_kl params/grad_norm params/max_grad_norm
params/kl_coef params/lr params/ratio_first_microbatch_maxdev timing/rollout_s timing/update_s
throughput/tokens_per_s rollout/group_reward_std rollout/solved_fraction rewards/chosen
rewards/rejected rewards/accuracy rewards/margin logps/chosen logps/rejected loss/dpo rm/accuracy
rm/margin rm/chosen_mean rm/rejected_mean loss/rm loss/sft eval/loss eval/perplexity
""".split()


def test_overrides_and_validation():
    t = Thresholds.from_mapping({"clip_frac_warn": "0.3", "value_window": 12})
    assert t.clip_frac_warn == 0.3 and t.value_window == 12 and isinstance(t.value_window, int)
    assert Thresholds().replace(rollout_kl_warn=6).rollout_kl_warn == 6.0
    with pytest.raises(ConfigError, match="did you mean 'clip_frac_warn'"):
        Thresholds.from_mapping({"clip_frac_wran": 0.3})
    with pytest.raises(ConfigError, match="must be a float"):
        Thresholds.from_mapping({"clip_frac_warn": "high"})
    with pytest.raises(ConfigError, match=">= 1"):
        Thresholds.from_mapping({"recent_iterations": 0})
    with pytest.raises(ConfigError, match=">= 0"):
        Thresholds.from_mapping({"approx_kl_warn": -1})


def test_every_threshold_has_its_reasoning_in_the_source():
    source = inspect.getsource(Thresholds)
    for f in dataclasses.fields(Thresholds):
        m = re.search(rf"^    {f.name}: \w+ = [^\n]+\n    \"\"\"(.+?)\"\"\"", source, re.S | re.M)
        assert m and len(m.group(1).split()) >= 5, f"{f.name} needs a docstring giving its reasoning"


def test_docs_have_a_section_per_rule():
    text = DOCS.read_text()
    for name in RULES:
        assert f"\n### {name}\n" in text, name


def test_docs_give_every_threshold_with_its_real_default():
    text = DOCS.read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", text, re.M))
    for f in dataclasses.fields(Thresholds):
        assert f.name in rows, f"docs/diagnostics.md lacks a table row for {f.name}"
        documented = float(rows[f.name].split()[0])
        assert documented == f.default, f"{f.name}: docs say {documented}, code has {f.default}"


def test_glossary_defines_every_contract_metric():
    text = DOCS.read_text()
    for name in CONTRACT_METRICS:
        assert METRICS.get(name), name
        assert f"| `{name}` |" in text, name
