"""Row chunks of long micro-batches (rollout/logprobs.py `row_chunks`, issue 24: bounded activations
on the CPU): the cut itself by hand and as a property, and whole runs with chunks equal to runs
without them (the loss is a sum over rows or pairs, so chunks only change float rounding)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlhfkit.rollout.logprobs as logprobs_mod
from rlhfkit.rollout.logprobs import CHUNK_POSITIONS, chunk_positions, row_chunks


def test_row_chunks_by_hand():
    rows = torch.arange(16)
    full = torch.ones(16, 128)
    # 16 rows x 128 columns = 2048 positions -> ceil(2048 / 512) = 4 chunks of 4 rows
    assert [c.tolist() for c in row_chunks(rows, full, 512)] == [list(range(i, i + 4)) for i in range(0, 16, 4)]
    # width = the last real column over the rows (as trim cuts): 40 -> ceil(16 x 40 / 512) = 2 chunks of 8
    short = torch.zeros(16, 128)
    short[3, :40] = 1
    assert [len(c) for c in row_chunks(rows, short, 512)] == [8, 8]
    # 16 x 16 = 256 <= 512: one chunk, the micro-batch itself; None: never cut
    assert [len(c) for c in row_chunks(rows, full[:, :16], 512)] == [16]
    assert row_chunks(rows, full, None)[0] is rows
    # near-equal contiguous chunks keep the micro-batch's order: 5 rows of width 100, at most 200 -> 3 chunks
    order = torch.tensor([7, 2, 9, 4, 0])
    assert [c.tolist() for c in row_chunks(order, torch.ones(10, 100), 200)] == [[7, 2], [9, 4], [0]]
    assert chunk_positions(torch.device("cpu")) == CHUNK_POSITIONS and chunk_positions(torch.device("meta")) is None


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 40), width=st.integers(1, 64), budget=st.integers(1, 2048), seed=st.integers(0, 2**16))
def test_row_chunks_cover_the_rows_in_order_with_the_fewest_chunks(n, width, budget, seed):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randperm(n + 5, generator=g)[:n]
    mask = torch.zeros(n + 5, 64)
    mask[rows[0], :width] = 1
    chunks = row_chunks(rows, mask, budget)
    assert torch.equal(torch.cat(chunks), rows)  # every row once, in order
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1  # near-equal
    per_chunk = max(1, budget // width)  # rows that fit the budget; a row wider than it runs alone
    assert len(chunks) == math.ceil(n / per_chunk)  # the fewest chunks of at most per_chunk rows
    assert max(sizes) * width <= budget or max(sizes) == 1


def spy_chunks(monkeypatch, module) -> dict[str, list[int]]:
    """Record how many chunks each `row_chunks` call in `module` made, per setting of CHUNK_POSITIONS."""
    cuts: dict[str, list[int]] = {"whole": [], "chunked": []}
    real = module.row_chunks

    def spy(rows, mask, limit):
        out = real(rows, mask, limit)
        cuts["whole" if logprobs_mod.CHUNK_POSITIONS > 10**6 else "chunked"].append(len(out))
        return out

    monkeypatch.setattr(module, "row_chunks", spy)
    return cuts


def _metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def whole_then_chunked(monkeypatch, chunk: int, run):
    """run(name) once with chunks off ("whole") and once with CHUNK_POSITIONS = chunk ("chunked")."""
    out = []
    for name, positions in (("whole", 10**9), ("chunked", chunk)):
        monkeypatch.setattr(logprobs_mod, "CHUNK_POSITIONS", positions)
        out.append(run(name))
    return out


def assert_same(whole: dict, chunked: dict, keys) -> None:
    """Equal up to float rounding: within 1e-4 of the value's size, a size of at least 1e-3 (never zero)."""
    for key in keys:
        scale = max(abs(whole[key]), 1e-3)
        assert abs(chunked[key] - whole[key]) <= 1e-4 * scale, (key, whole[key], chunked[key])


@pytest.mark.parametrize("trainer", ["grpo", "ppo"])
def test_rl_runs_with_chunks_equal_runs_without(tmp_path, tiny_model_dir, monkeypatch, trainer):
    """GRPO and PPO on a tiny model: micro-batches cut into chunks of 1-2 rows give the same losses,
    gradient norms and log-probs as whole micro-batches (fp32; the loss is a sum over rows), and the
    first-micro-batch ratio is still exactly 1 (the scoring pass cuts alike)."""
    from rlhfkit.runtime.config import build_config
    from rlhfkit.trainers.grpo import train as grpo_train
    from rlhfkit.trainers.grpo_config import GRPOConfig
    from rlhfkit.trainers.ppo import train as ppo_train
    from rlhfkit.trainers.ppo_config import PPOConfig

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(["Say hello.", "Write a word.", "Name a colour.", "Count to three."]))
    rw = tmp_path / "vowels.py"
    rw.write_text("def reward(prompts, completions, **kw):\n"
                  "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n")
    cuts = spy_chunks(monkeypatch, logprobs_mod)  # the scoring pass and the update cut with micro_batch_chunks
    runs = {}
    for name, positions in (("whole", 10**9), ("chunked", 6)):
        monkeypatch.setattr(logprobs_mod, "CHUNK_POSITIONS", positions)
        base = dict(model=str(tiny_model_dir), prompts=str(prompts), reward=f"python:{rw}:reward", iterations=2,
                    rollout_batch_size=8, mini_batch_size=4, micro_batch_size=4, max_new_tokens=6,
                    num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name=name, quiet=True,
                    tensorboard=False, seed=3)
        if trainer == "grpo":
            grpo_train(build_config(GRPOConfig, {**base, "group_size": 4}))
        else:
            ppo_train(build_config(PPOConfig, base))
        runs[name] = _metrics(tmp_path / "runs" / name / "metrics.jsonl")
    assert len(runs["whole"]) == len(runs["chunked"]) == 2
    assert max(cuts["whole"]) == 1 and max(cuts["chunked"]) > 1  # the second run did run in chunks
    for whole, chunked in zip(runs["whole"], runs["chunked"]):
        assert chunked["params/ratio_first_microbatch_maxdev"] == 0.0
        assert_same(whole, chunked, ("loss/policy", "params/grad_norm", "params/approx_kl", "rollout/entropy"))


@pytest.mark.parametrize("precompute", [True, False])
def test_dpo_with_chunks_equals_dpo_without(tmp_path, tiny_model_dir, monkeypatch, precompute):
    """DPO on a tiny model: pairs cut into chunks of one pair give the same losses, gradient norms
    and held-out metrics as whole micro-batches, and step 0 still starts at log 2 exactly (the
    reference table is cut as the steps are)."""
    from test_dpo import tiny_cfg

    import rlhfkit.trainers.dpo as dpo
    from rlhfkit.trainers.dpo import train

    cuts = spy_chunks(monkeypatch, dpo)

    def run(name):
        out = train(tiny_cfg(tmp_path, tiny_model_dir, precompute_ref_logps=precompute, lr=1e-2, max_steps=3,
                             run_name=name))
        return _metrics(tmp_path / "runs" / name / "metrics.jsonl"), out

    (whole, whole_summary), (chunked, chunked_summary) = whole_then_chunked(monkeypatch, 4, run)
    assert max(cuts["whole"]) == 1 and max(cuts["chunked"]) > 1  # the second run did run in chunks
    assert chunked[0]["loss/dpo"] == math.log(2) or chunked[0]["loss/dpo"] == pytest.approx(math.log(2), abs=1e-7)
    for a, b in zip(whole, chunked):
        assert_same(a, b, ("loss/dpo", "params/grad_norm", "rewards/margin", "logps/chosen"))
    held_whole, held_chunked = whole_summary.get("held_out", {}), chunked_summary.get("held_out", {})
    assert held_whole.keys() == held_chunked.keys()
    assert_same(held_whole, held_chunked, held_whole)


def test_online_dpo_with_chunks_equals_online_dpo_without(tmp_path, tiny_model_dir, monkeypatch):
    """Online DPO's step cuts its micro-batches of sampled pairs as DPO does: one-pair chunks give the same
    loss, gradient norm and implicit rewards as whole micro-batches, and the first step stays at log 2."""
    from test_online_dpo import tiny_cfg

    import rlhfkit.trainers.dpo as dpo
    from rlhfkit.trainers.online_dpo import train

    cuts = spy_chunks(monkeypatch, dpo)  # online DPO cuts with dpo.pair_chunks

    def run(name):
        train(tiny_cfg(tmp_path, tiny_model_dir, run_name=name, lr=1e-2, seed=5))
        return _metrics(tmp_path / "runs" / name / "metrics.jsonl")

    whole, chunked = whole_then_chunked(monkeypatch, 4, run)
    assert max(cuts["whole"]) == 1 and max(cuts["chunked"]) > 1
    assert chunked[0]["loss/dpo"] == pytest.approx(math.log(2), abs=1e-6)
    assert len(whole) == len(chunked) == 2
    for a, b in zip(whole, chunked):
        assert a["rollout/pairs"] == b["rollout/pairs"] > 0  # the same samples and judged pairs
        assert_same(a, b, ("loss/dpo", "params/grad_norm", "rewards/margin"))


@pytest.mark.parametrize("precompute", [True, False])
def test_kto_with_chunks_equals_kto_without(tmp_path, tiny_model_dir, monkeypatch, precompute):
    """KTO cuts its micro-batches (reference table, z_0 rows, steps, held-out pass) into chunks: one-row
    chunks give the same losses, reference points, gradient norms and held-out rewards as whole
    micro-batches, and the first step stays at 0.5 (beta r = 0 against z_0 = 0)."""
    from test_kto import tiny_cfg

    from rlhfkit.trainers.kto import train

    cuts = spy_chunks(monkeypatch, logprobs_mod)  # KTO cuts with micro_batch_chunks

    def run(name):
        out = train(tiny_cfg(tmp_path, tiny_model_dir, run_name=name, lr=1e-2, max_steps=3,
                             precompute_ref_logps=precompute))
        return _metrics(tmp_path / "runs" / name / "metrics.jsonl"), out

    (whole, whole_summary), (chunked, chunked_summary) = whole_then_chunked(monkeypatch, 2, run)
    assert max(cuts["whole"]) == 1 and max(cuts["chunked"]) > 1
    assert chunked[0]["loss/kto"] == pytest.approx(0.5, abs=1e-6)
    for a, b in zip(whole, chunked):
        assert_same(a, b, ("loss/kto", "params/grad_norm", "params/kl_reference_point", "rewards/chosen"))
    assert_same(whole_summary["held_out"], chunked_summary["held_out"], whole_summary["held_out"])
