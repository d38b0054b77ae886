"""How much of the update's forward/backward runs on padding, in the default demos' own rollouts.

    PYTHONPATH=src python bench/padding.py [ppo|grpo ...] [key=value ...]

Runs the command's default demo for one iteration (no held-out evaluation) and records every
micro-batch chunk the update runs (trainers/rl_update.py `micro_batch_chunks`, as the update cuts it).
A chunk runs at its micro-batch's trimmed widths: R response columns per row (right padding after
each row's stop) and P prompt columns per distinct prompt (left padding; a prompt several rows share
runs once). Printed per command:

  as run     the share of positions that are padding, over all chunks of all optimiser steps
  sorted     the same if each mini-batch's rows were put in micro-batches by response length (the
             GRPO family: whole groups, by their longest response), the cheapest composition change
  packed     0 by construction: what token packing / varlen attention would run (the real tokens)

and the positions of each, so the share of the update's work that composition or packing could save.
"""

from __future__ import annotations

import sys

import torch

import rlhfkit.trainers.rl_update as rl_update
from rlhfkit.rollout.core import Rollout
from rlhfkit.rollout.logprobs import micro_batch_chunks, positions_run, trimmed_widths


def real_positions(data: Rollout, rows: torch.Tensor) -> int:
    """Real tokens a forward over `rows` needs: every response token, and each distinct prompt's real tokens once."""
    prompts = torch.unique(data.query_ids[rows], dim=0, return_inverse=True)[1]
    first_rows = [int(rows[(prompts == p).nonzero()[0]]) for p in prompts.unique()]
    return int(data.real_mask[rows].sum()) + int(data.query_mask[first_rows].sum())


def chunk_positions(data: Rollout, chunks) -> tuple[int, int]:
    """(positions run, real positions) over (chunk rows, micro-batch rows) pairs."""
    run = real = 0
    for rows, micro in chunks:
        run += positions_run(data, rows, trimmed_widths(data, micro))
        real += real_positions(data, rows)
    return run, real


def by_length(mini: torch.Tensor, data: Rollout, group: int) -> torch.Tensor:
    """`mini`'s rows in order of response length, longest first; with group > 1 whole groups (rows
    with one prompt, kept together) by their longest response."""
    lengths = data.real_mask.sum(1)
    if group == 1:
        return mini[torch.argsort(lengths[mini], descending=True, stable=True)]
    key = torch.tensor([float(lengths[mini[(mini // group) == int(r) // group]].max()) for r in mini])
    return mini[torch.argsort(key * 1e6 - (mini // group).float(), descending=True, stable=True)]


def record(log: list):
    """A stand-in for rl_update.micro_batch_chunks that logs each call's arguments and result."""
    def wrapped(order, micro_batch_size, data, device, chunk_budget=640):
        out = micro_batch_chunks(order, micro_batch_size, data, device, chunk_budget)
        log.append((order, micro_batch_size, data, device, chunk_budget, out))
        return out
    return wrapped


def measure(command: str, extra: list[str]) -> dict[str, float]:
    from rlhfkit.cli import main

    log: list = []
    rl_update.micro_batch_chunks = record(log)
    try:
        main([command, "iterations=1", "num_eval_prompts=0", "quiet=true", "tensorboard=false", "overwrite=true",
              f"run_name=padding-{command}", "output_dir=/tmp/padding-runs", *extra])
    finally:
        rl_update.micro_batch_chunks = micro_batch_chunks
    group = 8 if command != "ppo" else 1  # the GRPO family's default group_size, shared prompts on
    for arg in extra:
        if arg.startswith("group_size="):
            group = int(arg.split("=")[1])
    run = real = sorted_run = 0
    for order, micro, data, device, budget, chunks in log:
        r, x = chunk_positions(data, chunks)
        run, real = run + r, real + x
        sorted_run += chunk_positions(data, micro_batch_chunks(by_length(order, data, group), micro, data, device,
                                                                budget))[0]
    return {"positions as run": run, "padding as run": 1 - real / run, "positions sorted": sorted_run,
            "padding sorted": 1 - real / sorted_run, "real positions": real, "optimiser steps": len(log)}


if __name__ == "__main__":
    commands = [a for a in sys.argv[1:] if "=" not in a] or ["ppo", "grpo"]
    extra = [a for a in sys.argv[1:] if "=" in a]
    for cmd in commands:
        m = measure(cmd, extra)
        print(f"{cmd}: {m['optimiser steps']} optimiser steps; padding as run {m['padding as run']:.1%} "
              f"({m['positions as run']} positions), length-sorted micro-batches {m['padding sorted']:.1%} "
              f"({m['positions sorted']}), packed 0% ({m['real positions']} real positions)")
