"""``env=openenv:URL``: an environment served over OpenEnv's protocol (docs/environments.md#openenv-environments).

OpenEnv environments run as HTTP servers. An episode is one WebSocket session on ``URL/ws``
(the protocol's HTTP ``/reset`` and ``/step`` build a new environment per request, so they cannot
hold an episode of several steps). The messages, JSON text frames:

    client: {"type": "reset", "data": {...keyword arguments of reset...}}
            {"type": "step", "data": {...the action's fields...}}
            {"type": "close"}
    server: {"type": "observation", "data": {"observation": {...}, "reward": float | null, "done": bool}}
            {"type": "error", "data": {"message": str, "code": str, ...}}

``GET URL/schema`` gives the JSON schemas of the action and the observation; ``GET URL/health``
answers while the server is up. This module maps that onto rlhfkit's ``Environment``: a reset
observation becomes the first user message, the model's turn becomes an action, a step's
observation the next user message, its reward and done the Step's. Nothing from OpenEnv's
package is imported: the adapter speaks the protocol with ``websockets`` (the ``openenv`` extra).
"""

from __future__ import annotations

import json
import math
import numbers
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from typing import Any

from rlhfkit.envs.base import Message, Step
from rlhfkit.errors import UserError

PREFIX = "openenv:"
TIMEOUT_S = 60.0  # longest wait for the server by default (env_timeout=): connecting, and each reply
SKIPPED_FIELDS = ("metadata",)  # fields every OpenEnv action and observation has; not the model's to write or read
STATE_FIELDS = ("done", "reward")  # observation fields that are the Step's, not the message's
CAPACITY = "CAPACITY_REACHED"
ACTION_ERRORS = ("VALIDATION_ERROR", "EXECUTION_ERROR")  # the model's action was refused or failed: the model reads it


@dataclass(frozen=True)
class Server:
    """Where an OpenEnv server is and what its actions look like.

    ``action_field``: the action's one text field (the model's turn goes there as is), or None
    (the turn must be a JSON object of ``action_fields``). ``timeout_s``: the longest wait for
    any reply.
    """

    spec: str
    url: str  # http(s)://HOST:PORT[/PATH], no trailing slash
    action_field: str | None
    action_fields: tuple[str, ...]
    timeout_s: float = TIMEOUT_S

    @property
    def ws_url(self) -> str:
        return "ws" + self.url[len("http"):] + "/ws"  # http -> ws, https -> wss


def is_openenv_spec(spec: str) -> bool:
    return spec.startswith(PREFIX)


def base_url(spec: str) -> str:
    """The server's URL of ``openenv:URL``: http(s)://HOST:PORT with an optional path, no trailing slash."""
    url = spec[len(PREFIX):].strip().rstrip("/")
    scheme, sep, rest = url.partition("://")
    if scheme not in ("http", "https") or not sep or not rest or any(c.isspace() for c in url):
        raise UserError(f"env {spec!r}: expected 'openenv:http://HOST:PORT' (the address of an OpenEnv "
                        "environment server)")
    return url


def get_json(url: str, spec: str, timeout_s: float) -> Any:
    """The JSON body of ``GET url``; UserError naming the spec when the server is down or answers anything else."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout_s) as response:  # noqa: S310 - the user's URL, http(s) only
            body = response.read(1 << 20)
    except urllib.error.HTTPError as e:
        raise UserError(f"env {spec!r}: GET {url} answered HTTP {e.code}; is it an OpenEnv environment server?") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(f"env {spec!r}: cannot reach {url}: {reason}; start the environment server first") from None
    try:
        return json.loads(body)
    except ValueError:
        raise UserError(f"env {spec!r}: GET {url} did not answer JSON (got {body[:60]!r}); "
                        "is it an OpenEnv environment server?") from None


def text_field(schema: dict) -> str | None:
    """The one field of an action schema the model writes as text: the only property besides
    ``metadata``, when it is a plain string. None when there are several or it is not a string."""
    fields = {k: v for k, v in schema.get("properties", {}).items() if k not in SKIPPED_FIELDS}
    if len(fields) == 1:
        (name, prop), = fields.items()
        if isinstance(prop, dict) and prop.get("type") == "string":
            return name
    return None


def connect(spec: str, timeout_s: float = TIMEOUT_S) -> Server:
    """Check the server of ``openenv:URL`` (``/health``, then ``/schema``) and read its action schema."""
    url = base_url(spec)
    try:
        import websockets.sync.client  # noqa: F401 - checked now, used per episode
    except ImportError:
        raise UserError(f"env {spec!r} needs the websockets package: pip install 'rlhfkit[openenv]'") from None
    get_json(url + "/health", spec, timeout_s)
    schemas = get_json(url + "/schema", spec, timeout_s)
    action = schemas.get("action") if isinstance(schemas, dict) else None
    if not isinstance(action, dict) or not isinstance(action.get("properties", {}), dict):
        raise UserError(f"env {spec!r}: GET {url}/schema has no action schema (expected "
                        '{"action": {"properties": {...}}, "observation": ...}); is it an OpenEnv environment server?')
    fields = tuple(k for k in action.get("properties", {}) if k not in SKIPPED_FIELDS)
    return Server(spec, url, text_field(action), fields, timeout_s)


def observation_text(observation: dict) -> str:
    """What the model reads of an observation: its one text field (besides done, reward and
    metadata) as is, else the remaining fields as JSON with sorted keys ("" when there are none)."""
    fields = {k: v for k, v in observation.items() if k not in (*SKIPPED_FIELDS, *STATE_FIELDS)}
    if len(fields) == 1 and isinstance(next(iter(fields.values())), str):
        return next(iter(fields.values()))
    return json.dumps(fields, sort_keys=True) if fields else ""


def action_data(turn: str, server: Server) -> dict | str:
    """The step's action for the model's turn: ``{action_field: turn}``, or the turn parsed as a
    JSON object when the action has several fields. A string: why the turn is not an action."""
    if server.action_field is not None:
        return {server.action_field: turn}
    try:
        data = json.loads(turn.strip())
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return f"error: reply with a JSON object with the fields {', '.join(server.action_fields) or '(none)'}"
    return data


def reset_data(record: dict) -> dict:
    """reset's keyword arguments for one prompt record: its JSON fields, and ``seed`` (the
    record's own integer ``seed``, else a hash of the record), so every episode of one record (a
    GRPO group) resets with the same arguments. The server passes reset() the ones it names."""
    data = {k: v for k, v in record.items() if _is_json(v)}
    if not (isinstance(record.get("seed"), int) and not isinstance(record.get("seed"), bool)):
        data["seed"] = zlib.crc32(json.dumps(data, sort_keys=True, default=str).encode()) & 0x7FFFFFFF
    return data


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def parse_reply(text: Any, server: Server, what: str) -> dict:
    """The ``data`` of an ``observation`` reply, checked: ``observation`` a dict, ``reward`` a
    finite number, a bool (OpenEnv allows one: 1 or 0) or null, ``done`` a bool. An ``error`` reply with an action code becomes
    ActionRejected; any other error and any malformed reply a UserError naming the server."""
    try:
        message = json.loads(text)
    except (TypeError, ValueError):
        raise UserError(f"env {server.spec!r}: the server's reply to {what} is not JSON: {str(text)[:80]!r}") from None
    kind = message.get("type") if isinstance(message, dict) else None
    data = message.get("data") if isinstance(message, dict) else None
    if kind == "error" and isinstance(data, dict):
        code, reason = data.get("code"), str(data.get("message", "")).strip()
        if code == CAPACITY:
            raise UserError(f"env {server.spec!r}: the server holds at most {data.get('max_sessions', '?')} sessions "
                            "at once and the rollout runs one per episode; start it with max_concurrent_envs at least "
                            "the rollout's episodes (rollout_batch_size)")
        if what == "step" and code in ACTION_ERRORS:
            raise ActionRejected(reason or str(code))
        raise UserError(f"env {server.spec!r}: the server refused {what}: {code}: {one_line(reason)}")
    if kind != "observation" or not isinstance(data, dict) or not isinstance(data.get("observation"), dict):
        raise UserError(f"env {server.spec!r}: the server's reply to {what} is not an observation "
                        f'(expected {{"type": "observation", "data": {{"observation": {{...}}, ...}}}}): {str(text)[:80]!r}')
    reward, done = data.get("reward"), data.get("done", False)
    if reward is not None and (not isinstance(reward, numbers.Real) or not math.isfinite(reward)):  # a bool is 1 or 0
        raise UserError(f"env {server.spec!r}: the server's reward after {what} is {reward!r}, not a finite number or null")
    if not isinstance(done, bool):
        raise UserError(f"env {server.spec!r}: the server's done after {what} is {done!r}, not true or false")
    return data


def one_line(text: str) -> str:
    return " ".join(text.split())[:200]


class ActionRejected(Exception):
    """The server refused the model's action (invalid fields) or its step failed on it."""


class OpenEnvEpisode:
    """One episode on an OpenEnv server: a WebSocket session from reset to done (or close)."""

    def __init__(self, server: Server):
        self.server = server
        self.connection = None

    def reset(self, record: dict) -> list[Message]:
        """Open a session, send reset with the record's fields; the observation is the first user message."""
        self.close()
        from websockets.sync.client import connect as ws_connect

        try:  # entered as the context manager it is; close() exits it
            self.connection = ws_connect(self.server.ws_url, open_timeout=self.server.timeout_s, proxy=None,
                                         close_timeout=1.0, max_size=1 << 22).__enter__()
        except Exception as e:  # noqa: BLE001 - refused, timed out, or no WebSocket at /ws (websockets' errors vary)
            raise UserError(f"env {self.server.spec!r}: cannot open a session at {self.server.ws_url}: "
                            f"{type(e).__name__}: {one_line(str(e))}") from None
        data = self._exchange({"type": "reset", "data": reset_data(record)}, "reset")
        return [{"role": "user", "content": observation_text(data["observation"])}]

    def step(self, history: list[Message], model_turn: str) -> Step:
        """Send the model's turn as the action; the observation is the next user message (none once done)."""
        if self.connection is None:
            raise UserError(f"env {self.server.spec!r}: step() before reset()")
        action = action_data(model_turn, self.server)
        if isinstance(action, str):  # not an action: the model reads why and tries again
            return Step([{"role": "user", "content": action}], None, False, {"action_error": True})
        try:
            data = self._exchange({"type": "step", "data": action}, "step")
        except ActionRejected as e:
            return Step([{"role": "user", "content": f"error: {one_line(str(e))}"}], None, False, {"action_error": True})
        reward = data.get("reward")
        if data.get("done", False):
            self.close()
            return Step(None, None if reward is None else float(reward), True)
        return Step([{"role": "user", "content": observation_text(data["observation"])}],
                    None if reward is None else float(reward), False)

    def close(self) -> None:
        """End the session (a close message, then the socket); safe to call twice."""
        connection, self.connection = self.connection, None
        if connection is None:
            return
        try:
            connection.send(json.dumps({"type": "close"}))
        except Exception:  # noqa: BLE001, S110 - the server may be gone already; closing is best effort
            pass
        connection.__exit__(None, None, None)

    def _exchange(self, message: dict, what: str) -> dict:
        """Send one message and read its reply (at most timeout_s); UserError when the session breaks."""
        from websockets.exceptions import ConnectionClosed

        try:
            self.connection.send(json.dumps(message))
        except ConnectionClosed:  # closed right after a message of its own (a full server's error): read that
            pass
        try:
            text = self.connection.recv(timeout=self.server.timeout_s)
        except TimeoutError:
            self.close()
            raise UserError(f"env {self.server.spec!r}: no reply to {what} within {self.server.timeout_s:g} s") from None
        except ConnectionClosed as e:
            self.connection = None
            raise UserError(f"env {self.server.spec!r}: the server closed the session during {what} "
                            f"({one_line(str(e))})") from None
        return parse_reply(text, self.server, what)
