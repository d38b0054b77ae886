"""Where the GRPO family's rollouts come from (step 1 of trainers/grpo.py): rollout sources, registered
by name. A source is built once per run, `source_cls(rl, cfg)`, and is a context manager around the
training loop; per iteration the loop calls `draw(it, round)` (once, or once per round of dynamic
sampling) and, after the update, `after_update()`.

    draw(it, round) -> (rollout, records)
        rollout: `cfg.rollout_batch_size` rows (per process), `cfg.prompts_per_iteration` groups of
        `cfg.group_size` consecutive rows that answer one prompt each; scored (`scores` (B,), and
        `reward_parts`, `info`, `prompts`, `completions`, `timings`), tokens left-padded prompts
        `query_ids`/`query_mask` (B, P) and right-padded `response_ids`/`response_mask` (B, R);
        `sampler_logprobs` (B, R) when the tokens were not sampled by the policy as it is now (NaN
        where unknown), else None. No log-probs: the trainer's pass computes them.
        records: the B prompt records (dicts with "prompt" and the reward's columns), in row order.
    after_update() -> metrics (floats, averaged over processes with the iteration's others)
    checkpointed() -> {name: object with state_dict / load_state_dict} saved with each checkpoint

Sources derive from trainers/rollout_source.py `RolloutSource` (no-op `after_update`, `checkpointed` and
exit unless they need them). A source class may have `prepare(cfg) -> dict`: run before the run folder exists (a user's file
imported, so a bad one stops the run with nothing written); its keywords go to the constructor.
An agent's episodes (the "agent" source, trainers/agents.py) may give any number of rows per
group: rows carry `info["episode"]` and the advantage step groups by episode.
"""

from __future__ import annotations

from collections.abc import Callable

from rlhfkit.algos.registry import choose
from rlhfkit.rollout import Rollout
from rlhfkit.trainers.agents import AgentSource
from rlhfkit.trainers.offpolicy import OneStepOffPolicy
from rlhfkit.trainers.rollout_source import RolloutSource


class OnPolicy(RolloutSource):
    """The policy samples each batch itself, now (HF generate, or the run's generation backend)."""

    def __init__(self, rl, cfg):
        self.rl, self.cfg = rl, cfg

    def draw(self, it: int, round: int = 0) -> tuple[Rollout, list[dict]]:
        """The next prompts_per_iteration prompts, each G times in a row, sampled with round's seed."""
        records = [rec for rec in self.rl.stream.next(self.cfg.prompts_per_iteration) for _ in range(self.cfg.group_size)]
        return self.rl.sample(records, it, round), records


# name -> source class; `rollout_source(cfg)` names the run's
ROLLOUT_SOURCES: dict[str, type] = {"on-policy": OnPolicy, "one-step-off-policy": OneStepOffPolicy,
                                    "agent": AgentSource}


def rollout_source(cfg) -> str:
    """The run's rollout source: agent with `agent`, one-step-off-policy with `one_step_off_policy`,
    else on-policy."""
    if cfg.agent:
        return "agent"
    return "one-step-off-policy" if cfg.one_step_off_policy else "on-policy"


def prepare_source(cfg) -> Callable:
    """`make(rl) -> RolloutSource` for the run's source, its `prepare(cfg)` (if it has one) run now."""
    cls = choose(ROLLOUT_SOURCES, rollout_source(cfg), "rollout source")
    kwargs = cls.prepare(cfg) if hasattr(cls, "prepare") else {}
    return lambda rl: cls(rl, cfg, **kwargs)
