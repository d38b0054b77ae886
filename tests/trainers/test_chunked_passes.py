"""Row chunks of long micro-batches (rollout/logprobs.py `row_chunks`: bounded activations
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
from rlhfkit.rollout.core import Rollout
from rlhfkit.rollout.logprobs import CHUNK_POSITIONS, chunk_positions, row_chunks


def _data(prompt_ids: list[int], prompt_lengths: list[int], response_lengths: list[int], P: int = 64,
          R: int = 128) -> Rollout:
    """Rows with prompt `prompt_ids[i]` (every token that id; equal ids = a shared prompt) of
    prompt_lengths[i] tokens, left-padded to P, and response_lengths[i] tokens, right-padded to R."""
    B = len(prompt_ids)
    cols = torch.arange(P)
    query_mask = (cols >= P - torch.tensor(prompt_lengths)[:, None]).long()
    query_ids = torch.tensor(prompt_ids)[:, None] * query_mask
    response_mask = (torch.arange(R) < torch.tensor(response_lengths)[:, None]).float()
    return Rollout(query_ids=query_ids, query_mask=query_mask, response_ids=torch.ones(B, R, dtype=torch.long),
                   response_mask=response_mask, stopped=torch.ones(B, dtype=torch.bool))


def test_row_chunks_by_hand():
    rows = torch.arange(16)
    distinct = _data(list(range(1, 17)), [10] * 16, [128] * 16)
    # 16 distinct prompts x (10 + 128) = 2208 positions > 640: 4 chunks of 4 rows (552), not 3 of 5-6 (828)
    assert [c.tolist() for c in row_chunks(rows, distinct, 640)] == [list(range(i, i + 4)) for i in range(0, 16, 4)]
    # widths = the longest prompt and response over the micro-batch (as trim cuts): one row of 30 + 40
    # and the rest 10 + 8 run 16 x (30 + 40) = 1120 -> 2 chunks of 8 (560)
    short = _data(list(range(1, 17)), [30] + [10] * 15, [8] * 3 + [40] + [8] * 12)
    assert [len(c) for c in row_chunks(rows, short, 640)] == [8, 8]
    # two groups of 8 rows sharing a 60-token prompt, 64 response tokens: a chunk runs each of its
    # prompts once. Whole: 16 x 64 + 2 x 60 = 1144; 2 chunks of 8 (one group each): 8 x 64 + 60 = 572
    grouped = _data([1] * 8 + [2] * 8, [60] * 16, [64] * 16)
    assert [len(c) for c in row_chunks(rows, grouped, 640)] == [8, 8]
    # at 560: 3 chunks of 6, 5, 5 rows: 6 x 64 + 60 = 444, 5 x 64 + 2 x 60 = 440 (rows 6-10, two prompts), 380
    assert [len(c) for c in row_chunks(rows, grouped, 560)] == [6, 5, 5]
    # 20 response tokens, 100-token prompts (whole 16 x 20 + 2 x 100 = 520): at 250 three chunks would
    # fit by rows (6 x 20 + 100 = 220) but the middle one runs both prompts (5 x 20 + 2 x 100 = 300): 4 chunks
    split = _data([1] * 8 + [2] * 8, [100] * 16, [20] * 16, P=128)
    assert [len(c) for c in row_chunks(rows, split, 250)] == [4, 4, 4, 4]
    # within the budget: one chunk, the micro-batch itself; None: never cut; a row over the budget runs alone
    assert [len(c) for c in row_chunks(rows, grouped, 1144)] == [16]
    assert row_chunks(rows, distinct, None)[0] is rows
    assert [len(c) for c in row_chunks(rows[:3], distinct, 100)] == [1, 1, 1]
    # near-equal contiguous chunks keep the micro-batch's order: 5 rows of 100 positions, at most 200 -> 3 chunks
    order = torch.tensor([7, 2, 9, 4, 0])
    assert [c.tolist() for c in row_chunks(order, _data(list(range(1, 11)), [50] * 10, [50] * 10), 200)] == \
        [[7, 2], [9, 4], [0]]
    # items that map to several rows (a DPO pair: its chosen and its rejected row share the prompt)
    pairs = _data(list(range(1, 9)) * 2, [20] * 16, [30] * 16)  # pair i = rows i and 8 + i
    # a pair runs 2 x 30 + 20 = 80 positions: 8 pairs = 640 fit, at 320 4 pairs do
    assert [len(c) for c in row_chunks(torch.arange(8), pairs, 640, to_rows=lambda c: torch.cat([c, c + 8]))] == [8]
    assert [len(c) for c in row_chunks(torch.arange(8), pairs, 320, to_rows=lambda c: torch.cat([c, c + 8]))] == [4, 4]
    assert chunk_positions(torch.device("cpu")) == CHUNK_POSITIONS and chunk_positions(torch.device("meta")) is None
    assert chunk_positions(torch.device("cpu"), 40) == 40 and chunk_positions(torch.device("meta"), 40) is None


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 24), group=st.integers(1, 8), budget=st.integers(1, 2048), seed=st.integers(0, 2**16))
def test_row_chunks_are_the_fewest_near_equal_chunks_within_the_budget(n, group, budget, seed):
    g = torch.Generator().manual_seed(seed)
    B = n + 5
    per_group = torch.randint(1, 64, (B,), generator=g).tolist()
    prompt_lengths = [per_group[i // group] for i in range(B)]  # a group's rows share one prompt
    response_lengths = torch.randint(1, 128, (B,), generator=g).tolist()
    data = _data([1 + i // group for i in range(B)], prompt_lengths, response_lengths)
    rows = torch.randperm(B, generator=g)[:n].sort().values  # sorted: a group's rows stay together
    chunks = row_chunks(rows, data, budget)
    assert torch.equal(torch.cat(chunks), rows)  # every row once, in order
    sizes = [len(c) for c in chunks]
    assert max(sizes) - min(sizes) <= 1  # near-equal
    # positions written out: the micro-batch's widths, R per row, P per distinct prompt in the chunk
    P = max(prompt_lengths[r] for r in rows.tolist())
    R = max(response_lengths[r] for r in rows.tolist())

    def positions(c):
        return len(c) * R + len({int(r) // group for r in c}) * P

    assert all(positions(c) <= budget or len(c) == 1 for c in chunks)
    if 1 < len(chunks) < n:  # one chunk fewer would not fit (nor would any smaller k)
        fewer = torch.tensor_split(rows, len(chunks) - 1)
        assert any(positions(c) > budget for c in fewer)


def spy_chunks(monkeypatch, module) -> dict[str, list[int]]:
    """Record how many chunks each `row_chunks` call in `module` made, by the budget it was given."""
    cuts: dict[str, list[int]] = {"whole": [], "chunked": []}
    real = module.row_chunks

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        budget = args[2] if len(args) > 2 else kwargs["max_positions"]
        cuts["whole" if budget is None or budget > 10**6 else "chunked"].append(len(out))
        return out

    monkeypatch.setattr(module, "row_chunks", spy)
    return cuts


def _metrics(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def whole_then_chunked(chunk: int, run):
    """run(name, cpu_chunk_positions) once with chunks off ("whole") and once with the budget `chunk` ("chunked")."""
    return [run(name, positions) for name, positions in (("whole", 10**9), ("chunked", chunk))]


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
    from rlhfkit.core.config import build_config
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
        base = dict(cpu_chunk_positions=positions, model=str(tiny_model_dir), prompts=str(prompts), reward=f"python:{rw}:reward", iterations=2,
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

    import rlhfkit.trainers.pairs as pairs
    from rlhfkit.trainers.dpo import train

    cuts = spy_chunks(monkeypatch, pairs)  # DPO cuts with pairs.pair_chunks

    def run(name, positions):
        out = train(tiny_cfg(tmp_path, tiny_model_dir, precompute_ref_logps=precompute, lr=1e-2, max_steps=3,
                             run_name=name, cpu_chunk_positions=positions))
        return _metrics(tmp_path / "runs" / name / "metrics.jsonl"), out

    (whole, whole_summary), (chunked, chunked_summary) = whole_then_chunked(4, run)
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

    import rlhfkit.trainers.pairs as pairs
    from rlhfkit.trainers.online_dpo import train

    cuts = spy_chunks(monkeypatch, pairs)  # online DPO cuts with pairs.pair_chunks, as DPO does

    def run(name, positions):
        train(tiny_cfg(tmp_path, tiny_model_dir, run_name=name, lr=1e-2, seed=5, cpu_chunk_positions=positions))
        return _metrics(tmp_path / "runs" / name / "metrics.jsonl")

    whole, chunked = whole_then_chunked(4, run)
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

    def run(name, positions):
        out = train(tiny_cfg(tmp_path, tiny_model_dir, run_name=name, lr=1e-2, max_steps=3,
                             precompute_ref_logps=precompute, cpu_chunk_positions=positions))
        return _metrics(tmp_path / "runs" / name / "metrics.jsonl"), out

    (whole, whole_summary), (chunked, chunked_summary) = whole_then_chunked(2, run)
    assert max(cuts["whole"]) == 1 and max(cuts["chunked"]) > 1
    assert chunked[0]["loss/kto"] == pytest.approx(0.5, abs=1e-6)
    for a, b in zip(whole, chunked):
        assert_same(a, b, ("loss/kto", "params/grad_norm", "params/kl_reference_point", "rewards/chosen"))
    assert_same(whole_summary["held_out"], chunked_summary["held_out"], whole_summary["held_out"])
