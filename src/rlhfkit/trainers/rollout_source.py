"""The base of the GRPO family's rollout sources (the contract: trainers/grpo_sources.py).

A source defines `draw(it, round)`; what it does not need is inherited from here: no metrics after the
update, nothing to checkpoint, nothing to release when the training loop ends.
"""

from __future__ import annotations

from rlhfkit.rollout import Rollout


class RolloutSource:
    """A rollout source: `draw` per iteration; `after_update`, `checkpointed` and leaving the `with`
    block do nothing unless a source overrides them (trainers/offpolicy.py's does)."""

    def draw(self, it: int, round: int = 0) -> tuple[Rollout, list[dict]]:
        raise NotImplementedError

    def after_update(self) -> dict[str, float]:
        """Metrics of the work after the update (floats, averaged over processes with the iteration's)."""
        return {}

    def checkpointed(self) -> dict:
        """{name: object with state_dict / load_state_dict} saved with each checkpoint."""
        return {}

    def __enter__(self) -> RolloutSource:
        return self

    def __exit__(self, *exc) -> None:
        return None
