"""One source of truth for metric meanings: docs/diagnostics.md's glossary is generated from
rlhfkit.diagnostics.glossary, every metric a trainer logs has an entry, and the entries say what the
maths in rlhfkit.algos computes."""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

from rlhfkit import algos
from rlhfkit.diagnostics import glossary
from rlhfkit.diagnostics.glossary import METRICS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "diagnostics.md"
NAMESPACES = ("rollout", "agent", "loss", "params", "timing", "throughput", "rewards", "logps", "rm", "eval", "data", "trpo")
LITERAL = re.compile(r"[\"']((?:" + "|".join(NAMESPACES) + r")/[a-z0-9_]+)[\"']")


def sources() -> str:
    """Where metrics are made: the trainers, rlhfkit.algos (DPO's rewards/* and logps/*), the reward
    functions that measure their own calls (rlhfkit.rewards: seconds waited on reward servers, reward=code's
    reward/code_*_rate) and the agent rollout (agent/*)."""
    files = [*(ROOT / "src/rlhfkit/trainers").rglob("*.py"), *(ROOT / "src/rlhfkit/algos").rglob("*.py"),
             *(ROOT / "src/rlhfkit/rewards").rglob("*.py"),
             *(ROOT / "src/rlhfkit/rollout").glob("agent*.py")]  # agent episodes' metrics
    return "\n".join(f.read_text(encoding="utf-8") for f in files)


def logged_names() -> set[str]:
    """Namespaced metric names written as string literals in `sources()`."""
    return set(LITERAL.findall(sources()))


def test_docs_glossary_is_the_generated_one():
    text = DOCS.read_text(encoding="utf-8")
    assert glossary.BEGIN in text and glossary.END in text, "run: python -m rlhfkit.diagnostics.glossary --write docs/diagnostics.md"
    block = text[text.index(glossary.BEGIN) : text.index(glossary.END) + len(glossary.END)]
    assert block == glossary.render_markdown(), "docs/diagnostics.md's glossary differs from glossary.py: regenerate it"
    assert glossary.replace_block(text) == text


def test_every_logged_metric_has_an_entry_and_every_entry_is_logged():
    names = logged_names()
    assert {"rollout/return_mean", "rollout/value_mean", "rollout/advantage_mean_raw", "rollout/non_score_reward",
            "rollout/score_std", "params/ratio_mean", "timing/generate_s"} <= names  # the scan sees them
    missing = sorted(names - set(METRICS))
    assert not missing, f"logged but not in the glossary: {missing}"
    text = sources()  # names built as f"rollout/{k}" appear only as their last part, "k"
    stale = sorted(n for n in METRICS if "/" in n and n not in names and f'"{n.split("/")[-1]}"' not in text)
    assert not stale, f"in the glossary but logged nowhere: {stale}"
    assert '"tokens":' in text and "tokens" in METRICS  # SFT's one metric without a namespace


def test_the_entries_say_what_the_maths_computes():
    """The definitions that had drifted: approx_kl is k2, clip fractions count only an active clip,
    loss/entropy is the positive entropy (a bonus), rollout/reward_mean includes the KL penalty."""
    mask = torch.ones(1, 4, dtype=torch.bool)
    logp = torch.tensor([[0.1, 0.3, -0.4, -0.1]], dtype=torch.float64)
    old = torch.zeros_like(logp)
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]], dtype=torch.float64)
    # ratios e^0.1, e^0.3 (> 1.2, A > 0: clipped), e^-0.4 (< 0.8 but A > 0: the clip changes nothing), e^-0.1
    _, m = algos.ppo_policy_loss(logp, old, adv, mask, clip_eps=0.2)
    assert math.isclose(m["approx_kl"], 0.5 * (0.01 + 0.09 + 0.16 + 0.01) / 4, rel_tol=1e-6)
    assert "0.5 * (log pi - log pi_old)^2 (k2" in METRICS["params/approx_kl"]
    assert math.isclose(m["policy_clip_frac"], 1 / 4, rel_tol=1e-6)  # only t=1; t=2 lies outside the range
    assert "strictly greater" in METRICS["params/policy_clip_frac"] and "clip is active" in METRICS["params/policy_clip_frac"]
    ent = algos.entropy_loss(torch.full((1, 4), 2.0), mask)
    assert float(ent) == 2.0 and "- ent_coef * loss/entropy" in METRICS["loss/total"]
    rewards, shaping = algos.shape_rewards(torch.tensor([0.5]), logp.float(), old.float(), mask, kl_coef=0.1)
    kl_sum = float(logp.sum())  # k1 = logp - ref_logp summed over the sequence = -0.1
    assert math.isclose(float(rewards.sum()), 0.5 - 0.1 * kl_sum, rel_tol=1e-6)
    assert math.isclose(shaping["non_score_reward"], -0.1 * kl_sum, rel_tol=1e-5)
    assert "plus, in PPO with kl_penalty=reward, the per-token KL penalty" in METRICS["rollout/reward_mean"]


def test_write_rewrites_only_the_generated_block(tmp_path):
    f = tmp_path / "doc.md"
    f.write_text(f"# Title\n\nbefore\n\n{glossary.BEGIN}\n| stale | table |\n{glossary.END}\n\nafter\n")
    assert glossary.main(["--write", str(f)]) == 0
    text = f.read_text()
    assert text.startswith("# Title\n\nbefore\n\n") and text.endswith("\n\nafter\n") and "stale" not in text
    assert "| `rollout/return_mean` |" in text
