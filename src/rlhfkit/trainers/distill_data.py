"""Distillation's off-policy sequences (the 1 - lmbda share): answers the teacher samples, or the
completions a prompt set carries (`completion_field`). Both come back as a scored Rollout, like the
student's own samples (trainers/rl.py `sample_rollout`), so every later step treats them alike."""

from __future__ import annotations

import dataclasses
import time

from rlhfkit.data.chat import format_prompts
from rlhfkit.data.prompts import info_lists
from rlhfkit.errors import DataError
from rlhfkit.models.policy import ActorCritic
from rlhfkit.rollout import Rollout
from rlhfkit.rollout.core import rollout_from_tokens
from rlhfkit.rollout.score import score_rollout

TEACHER_SEED_OFFSET = 15_485_863  # the teacher's sampling seeds, apart from the student's


def teacher_rollout(rl, cfg, records: list[dict], iteration: int) -> Rollout:
    """One answer per record sampled from the teacher (rl.reference's frozen model) with the run's
    sampling settings, scored by the run's reward."""
    from rlhfkit.core.seeding import sampling_seed
    from rlhfkit.trainers.rl import sample_rollout

    teacher = ActorCritic(rl.reference.frozen, None, share_prompts=rl.core.share_prompts,
                          share_prefix=rl.core.share_prefix)
    seed = sampling_seed(cfg.seed, rl.rank, iteration) + TEACHER_SEED_OFFSET
    with rl.tracker.phase("rollout", None):
        return sample_rollout(teacher, rl.tok, records, cfg, rl.params, seed, rl.reward_fn, rl.device)


def completion_tokens(tok, text: str, max_new_tokens: int, stop_id: int) -> list[int]:
    """A completion's tokens ending with the stop token, cut to max_new_tokens (a cut one has no stop)."""
    ids = tok(text, add_special_tokens=False)["input_ids"] + [stop_id]
    return ids[:max_new_tokens]


def dataset_rollout(rl, cfg, records: list[dict]) -> Rollout:
    """The records' own completions (`cfg.completion_field`) as a Rollout: prompts formatted and
    left-padded as for sampling, completions right-padded and masked up to their stop token."""
    t0 = time.perf_counter()
    missing = [i for i, r in enumerate(records) if not isinstance(r.get(cfg.completion_field), str)]
    if missing:
        raise DataError(f"prompts: off_policy_data=dataset needs a text field '{cfg.completion_field}' in every "
                        f"record (completion_field); record {missing[0]} has none")
    tok, stop = rl.tok, rl.params.stop_ids[0]
    formatted = format_prompts(tok, [r["prompt"] for r in records], cfg)
    enc = tok(formatted, return_tensors="pt", padding=True, add_special_tokens=False)
    if rl.params.max_prompt_length is not None:  # left padding: the last columns hold every prompt's end
        enc = {k: v[:, -rl.params.max_prompt_length :] for k, v in enc.items()}
    rows = [completion_tokens(tok, r[cfg.completion_field], cfg.max_new_tokens, stop) for r in records]
    rollout = dataclasses.replace(rollout_from_tokens(tok, enc, rows, tuple(rl.params.stop_ids)),
                                  prompts=[str(r["prompt"]) for r in records], info=info_lists(records))
    t1 = time.perf_counter()
    rollout = score_rollout(rollout, records, rl.reward_fn)
    return dataclasses.replace(rollout, timings={"timing/generate_s": t1 - t0,
                                                 "timing/reward_s": time.perf_counter() - t1, **rollout.timings})
