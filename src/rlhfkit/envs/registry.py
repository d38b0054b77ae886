"""Turn an ``env=`` spec into an environment factory (docs/environments.md).

Specs: ``arithmetic-tool``, ``self-correct``, ``python:MODULE:CLASS``, ``python:FILE.py:CLASS``,
``FILE.py:CLASS`` and ``openenv:URL`` (an OpenEnv environment server, envs/openenv.py); user code
is imported as for ``reward=python:...``.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any

from rlhfkit.core.imports import first_line, get_attribute, is_file_source, load_source, split_target
from rlhfkit.envs.base import Environment
from rlhfkit.envs.builtin import ArithmeticToolEnv, SelfCorrectEnv
from rlhfkit.envs.openenv import TIMEOUT_S, OpenEnvEpisode, connect, is_openenv_spec
from rlhfkit.envs.tools import TAG, observation_role, tool_format
from rlhfkit.errors import UserError

BUILTINS: dict[str, type] = {"arithmetic-tool": ArithmeticToolEnv, "self-correct": SelfCorrectEnv}
SPEC_FORMS = (*BUILTINS, "python:MODULE:CLASS", "python:FILE.py:CLASS", "FILE.py:CLASS", "openenv:http://HOST:PORT")


def make_env_factory(spec: str, tokenizer: Any = None, timeout_s: float = TIMEOUT_S) -> Callable[[], Environment]:
    """A zero-argument callable that returns a fresh environment; the rollout calls it once per episode.

    ``tokenizer`` (the policy's; optional) decides the tool-call format and the role of tool
    results (tools.tool_format, tools.observation_role; without it: the tag format and user
    messages, which suit SmolLM2). A constructor that has parameters named ``tokenizer``,
    ``tool_format`` or ``observation_role`` receives them. The class is instantiated once here,
    so a failing constructor is reported before training starts (that instance serves the first
    episode). The factory's ``prompts`` attribute is the class's ``prompts`` (the data spec of
    its own problems) or None; its ``exact_match`` is the class's (True: the mean episode reward is
an accuracy). ``timeout_s``: for ``openenv:URL``, the longest wait for its server (connecting,
``/health``, ``/schema`` and each reply; the ``env_timeout`` option). Raises UserError for unknown specs, failed imports and classes
    without reset and step.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"env spec must be a non-empty string, got {spec!r}; expected one of: {', '.join(SPEC_FORMS)}")
    spec = spec.strip()
    label = f"env {spec!r}"
    if is_openenv_spec(spec):  # the server is checked now; each episode opens its own session
        make_env = _checked_factory(functools.partial(OpenEnvEpisode, connect(spec, timeout_s)), "a session", label)
        make_env.env_spec, make_env.prompts, make_env.exact_match = spec, None, False  # type: ignore[attr-defined]
        return make_env
    if spec in BUILTINS:
        cls, what = BUILTINS[spec], spec
    else:
        cls = _user_class(spec, label)
        what = f"{cls.__name__}()"
    offered = {"tokenizer": tokenizer, "tool_format": TAG, "observation_role": "user"}
    if tokenizer is not None:
        offered.update(tool_format=tool_format(tokenizer), observation_role=observation_role(tokenizer))
    kwargs = {k: v for k, v in offered.items() if k in _parameters(cls)}
    make_env = _checked_factory(functools.partial(cls, **kwargs), what, label)
    make_env.env_spec = spec  # type: ignore[attr-defined]
    prompts = getattr(cls, "prompts", None)
    make_env.prompts = prompts if isinstance(prompts, str) and prompts else None  # type: ignore[attr-defined]
    make_env.exact_match = getattr(cls, "exact_match", False) is True  # type: ignore[attr-defined]
    return make_env


def _user_class(spec: str, label: str) -> type:
    """The class that ``python:MODULE:CLASS``, ``python:FILE.py:CLASS`` or ``FILE.py:CLASS`` names."""
    kind, _, rest = spec.partition(":")
    parts = split_target(rest if kind == "python" else spec)
    if kind != "python" and (parts is None or not is_file_source(parts[0])):
        raise UserError(f"unknown env {spec!r}{_hint(spec, parts)}; expected one of: {', '.join(SPEC_FORMS)}")
    if parts is None:
        raise UserError(f"{label}: expected 'python:MODULE:CLASS', 'python:FILE.py:CLASS' or 'FILE.py:CLASS'")
    source, attr = parts
    cls = get_attribute(load_source(source, label), source, attr, label)
    if not isinstance(cls, type):
        raise UserError(f"{label}: {attr!r} is a {type(cls).__name__}, not a class")
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        raise UserError(
            f"{label}: class {attr} has no {' or '.join(missing)} method; an environment needs "
            "reset(record) and step(history, model_turn) (docs/environments.md)"
        )
    return cls


def _hint(spec: str, parts: tuple[str, str] | None) -> str:
    if parts is not None:  # MODULE:CLASS without the python: prefix
        return f" (did you mean 'python:{spec}'?)"
    close = difflib.get_close_matches(spec, [*BUILTINS, "python", "openenv"], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _parameters(cls: type) -> set[str]:
    """The constructor's named parameters (a ``**kwargs`` catch-all is not a name, so gets nothing)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # some C-implemented classes have no signature
        return set()
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _checked_factory(make: Callable[[], Environment], what: str, label: str) -> Callable[[], Environment]:
    """``make`` with one instance built now, so construction errors surface at startup."""
    try:
        first = [make()]
    except Exception as e:
        raise UserError(f"{label}: creating {what} failed: {type(e).__name__}: {first_line(e)}") from None

    def make_env() -> Environment:
        return first.pop() if first else make()

    return make_env
