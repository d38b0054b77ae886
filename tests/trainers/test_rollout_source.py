"""The rollout sources share one base (trainers/rollout_source.py): its no-op hooks are written once."""

from __future__ import annotations

import pytest

from rlhfkit.trainers.grpo_sources import ROLLOUT_SOURCES
from rlhfkit.trainers.rollout_source import RolloutSource

HOOKS = ("after_update", "checkpointed", "__enter__", "__exit__")


@pytest.mark.parametrize("name", sorted(ROLLOUT_SOURCES))
def test_every_registered_source_is_a_rollout_source_that_draws(name):
    cls = ROLLOUT_SOURCES[name]
    assert issubclass(cls, RolloutSource)
    assert "draw" in vars(cls)  # its own sampling


def test_a_source_that_needs_no_hook_inherits_it():
    """Only the one-step-off-policy source has work after the update, state to checkpoint and a thread to
    stop; the others define none of the hooks."""
    own = {name: sorted(h for h in HOOKS if h in vars(cls)) for name, cls in ROLLOUT_SOURCES.items()}
    assert own == {"on-policy": [], "agent": [], "one-step-off-policy": ["__exit__", "after_update", "checkpointed"]}


def test_the_base_hooks_do_nothing():
    class Draws(RolloutSource):
        def draw(self, it, round=0):
            return None, []

    with Draws() as source:
        assert source.after_update() == {} and source.checkpointed() == {}
    with pytest.raises(NotImplementedError):
        RolloutSource().draw(0)
