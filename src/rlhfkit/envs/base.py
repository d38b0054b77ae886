"""The environment interface of multi-turn rollouts (docs/environments.md).

An environment turns one prompt record into an episode of several turns:

    messages = env.reset(record)                  # the first message(s), chat-format dicts
    obs, reward, done = env.step(history, turn)   # after each model turn

`history` is every message so far (the reset messages, then alternating model turns and
observations) and `turn` the model's new turn as text. `obs` is a list of messages the
environment writes next (a tool's output, a user's follow-up) or None; `reward` a float placed
on the last token of the turn it rewards, or None; `done` ends the episode. An episode also
ends at the rollout's `max_turns` or `max_total_tokens`.

One environment object serves one episode at a time: the rollout calls `make_env()` once per
row, so an environment may keep per-episode state in `self`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rlhfkit.errors import UserError

Message = dict  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}


@dataclass
class Step:
    """What the environment says after a model turn."""

    observation: list[Message] | None = None  # messages appended to the context; None: nothing
    reward: float | None = None  # reward for the turn just taken; None: no reward for it
    done: bool = False  # the episode is over
    info: dict = field(default_factory=dict)  # e.g. {"tool_call": "calculator", "tool_error": False}; summed into metrics

    def __iter__(self):  # unpacks like the (obs, reward, done) tuple
        return iter((self.observation, self.reward, self.done))


@runtime_checkable
class Environment(Protocol):
    def reset(self, record: dict) -> list[Message]:
        """The first message(s) of the episode for one prompt record (its `prompt` and info fields)."""

    def step(self, history: list[Message], model_turn: str) -> Step | tuple:
        """React to the model's turn: (observation messages or None, reward or None, done)."""


def as_step(result: Step | tuple, where: str = "env") -> Step:
    """A step() result as a Step: a Step as is, or an (obs, reward, done[, info]) tuple; an
    observation that is one message dict becomes a list of it.

    Checks what a user environment returned, so a mistake there reads as one clear line
    (UserError naming `where`) instead of failing deep in the rollout.
    """
    if isinstance(result, Step):
        step = result
    elif isinstance(result, tuple) and len(result) in (3, 4):
        step = Step(*result)
    else:
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        raise UserError(f"{where}: step() must return a Step or an (observation, reward, done) tuple, got {got}")
    observation = [step.observation] if isinstance(step.observation, dict) else step.observation  # one message
    if observation is not None:
        check_messages(observation, f"{where}: step() observation")
    reward, done = step.reward, step.done
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward)
    ):
        raise UserError(f"{where}: step() reward must be a finite number or None, got {reward!r}")
    if isinstance(done, str) or done not in (True, False):  # numpy's bool_ and 0/1 count
        raise UserError(f"{where}: step() done must be True or False, got {done!r}")
    if not isinstance(step.info, dict):
        raise UserError(f"{where}: step() info must be a dict, got {type(step.info).__name__}")
    return Step(observation, None if reward is None else float(reward), bool(done), step.info)


def check_messages(messages: object, where: str) -> list[Message]:
    """`messages` if it is a list of {"role": str, "content": str} dicts, else UserError naming `where`."""
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise UserError(f"{where} must be a list of messages like {{'role': 'user', 'content': '...'}}, "
                        f"got {messages!r:.80}")
    return messages
