"""``reward=http://HOST:PORT/PATH``: a reward scored by a server, in OpenRLHF's remote reward protocol,
so a reward model or verifier can run on another machine (`rlhfkit serve-reward`, OpenRLHF's
``serve_rm``, or any server that speaks the protocol).

One request (POST, JSON; ``Authorization: Bearer KEY`` when ``reward_api_key_env`` names a key):

    {"query": [prompt + completion, ...],   # OpenRLHF's field: the prompt's text followed by the response
     "prompts": [prompt text, ...],
     "labels": [label, ...],                 # `reward_label_key`, else answer/ground_truth (peers.labels_of)
     "completions": [completion text, ...],  # rlhfkit's addition: the response alone
     COLUMN: [value, ...] ...}               # every other column of the prompt records, by its name

The answer: ``{"rewards": [number, ...]}``, one finite number per sample, in order. A batch is cut into
requests of `reward_batch_size` samples, sent `reward_concurrency` at a time; several servers
(``http://a:1/r+http://b:2/r``) take the requests in turn. A request that fails to connect, times
out or gets a 5xx/429 answer is retried `reward_retries` times after 0.5 s, 1 s, 2 s, ... (capped at
8 s); any other failure, and every malformed answer, stops the run with one line naming the server and
the first bad item.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlhfkit.data.chat import text_of
from rlhfkit.errors import UserError
from rlhfkit.rewards.peers import labels_of
from rlhfkit.rewards.scoring import RewardError

PROTOCOL_KEYS = ("query", "prompts", "labels", "completions")
MAX_ANSWER_BYTES = 64 << 20  # a rewards list is small: a larger answer is not one
BACKOFF_CAP_S = 8.0
CHECK_TIMEOUT_S = 10.0
LOOPBACK = ("127.0.0.1", "::1", "localhost")


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class RemoteSettings:
    """How a run talks to reward servers (the `reward_*` options of trainers/reward_options.py RemoteRewardArgs)."""

    batch_size: int = 64  # samples per request
    concurrency: int = 4  # requests in flight at once
    timeout: float = 60.0  # seconds per request
    retries: int = 3  # further tries of a failed request
    backoff: float = 0.5  # seconds before the first retry; doubled each time
    api_key: str | None = None  # sent as a bearer token
    label_key: str | None = None  # the column sent as `labels`


def settings_from(options: Mapping[str, Any], spec: str) -> RemoteSettings:
    """RemoteSettings from the run's reward options (defaults where a key is absent); the API key is
    read from the environment variable `reward_api_key_env` names (an error when it is unset)."""
    base = RemoteSettings()
    return RemoteSettings(batch_size=int(options.get("reward_batch_size", base.batch_size)),
                          concurrency=int(options.get("reward_concurrency", base.concurrency)),
                          timeout=float(options.get("reward_timeout", base.timeout)),
                          retries=int(options.get("reward_retries", base.retries)),
                          api_key=api_key_from(options.get("reward_api_key_env") or "", spec, "reward_api_key_env"),
                          label_key=options.get("reward_label_key") or None)


def api_key_from(variable: str, spec: str, option: str) -> str | None:
    """The value of environment variable `variable` ("" = no key); an error naming `option` when unset."""
    if not variable:
        return None
    value = os.environ.get(variable, "")
    if not value:
        raise UserError(f"reward {spec!r}: {option}={variable} but the environment variable {variable} is unset "
                        "or empty; export it with the server's access token")
    return value


# ----------------------------------------------------------------------------- URLs


def parse_urls(spec: str) -> list[str]:
    """``http://a:1/p+http://b:2/p`` -> the server URLs, each checked to be http(s) with a host."""
    urls = [u.strip() for u in spec.split("+") if u.strip()]
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"reward {spec!r}: {url!r} is not an http(s) URL; expected "
                            "'http://HOST:PORT/PATH' (several servers joined with +)")
        try:
            parts.port  # noqa: B018  (raises on a port that is not a number)
        except ValueError:
            raise UserError(f"reward {spec!r}: {url!r} has a port that is not a number") from None
    return urls


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def check_reachable(url: str, spec: str, timeout: float) -> None:
    """A TCP connection to the server opens (checked once, before any model loads)."""
    host, port = host_port(url)
    try:
        with socket.create_connection((host, port), timeout=min(timeout, CHECK_TIMEOUT_S)):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise UserError(f"reward {spec!r}: cannot reach the reward server at {host}:{port} ({reason}); start it "
                        f"first (e.g. `rlhfkit serve-reward sentiment --port {port}`) or fix the URL") from None


def _opener(url: str) -> urllib.request.OpenerDirector:
    """Loopback servers are reached directly, whatever proxy the environment names."""
    if host_port(url)[0] in LOOPBACK:
        return urllib.request.build_opener(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener()


# ----------------------------------------------------------------------------- the reward


class RemoteReward:
    """The reward function of ``reward=http(s)://...``: ``(prompts, completions, **columns) -> list[float]``."""

    def __init__(self, urls: list[str], settings: RemoteSettings, name: str):
        self.urls, self.settings, self.reward_name = urls, settings, name
        self._lock = threading.Lock()
        self._waited = 0.0

    def __call__(self, prompts: Sequence, completions: Sequence, **columns: Any) -> list[float]:
        n, size = len(prompts), self.settings.batch_size
        t0 = time.perf_counter()
        chunks = [(start, min(start + size, n)) for start in range(0, n, size)]
        with concurrent.futures.ThreadPoolExecutor(max(1, min(self.settings.concurrency, len(chunks)))) as pool:
            futures = [pool.submit(self._score_chunk, i, a, b, prompts, completions, columns)
                       for i, (a, b) in enumerate(chunks)]
            scores = [x for f in futures for x in f.result()]  # in order; the first failure is raised
        with self._lock:
            self._waited += time.perf_counter() - t0
        return scores

    def pop_metrics(self) -> dict[str, float]:
        """Seconds spent waiting on the servers since the last call (scoring.reward_metrics)."""
        with self._lock:
            waited, self._waited = self._waited, 0.0
        return {"timing/reward_remote_s": waited}

    def _score_chunk(self, index: int, a: int, b: int, prompts: Sequence, completions: Sequence,
                     columns: Mapping[str, Any]) -> list[float]:
        url = self.urls[index % len(self.urls)]
        payload = request_payload(prompts[a:b], completions[a:b], _rows(columns, a, b, len(prompts)),
                                  self.settings.label_key)
        body = post(url, json.dumps(payload, default=str).encode(), self.settings)
        return parse_rewards(url, body, b - a, a, payload)


def request_payload(prompts: Sequence, completions: Sequence, columns: Mapping[str, Any],
                    label_key: str | None) -> dict[str, list]:
    """The JSON body of one request (the module docstring's layout)."""
    p_text = [text_of(p) for p in prompts]
    c_text = [text_of(c) for c in completions]
    body = {k: list(v) for k, v in columns.items() if k not in PROTOCOL_KEYS}
    body.update({"query": [p + c for p, c in zip(p_text, c_text)], "prompts": p_text,
                 "labels": labels_of(columns, len(prompts), label_key), "completions": c_text})
    return body


def _rows(columns: Mapping[str, Any], a: int, b: int, n: int) -> dict[str, list]:
    """Samples a..b of the per-sample columns (a batch-wide value is left out)."""
    return {k: list(v[a:b]) for k, v in columns.items()
            if isinstance(v, (list, tuple)) and len(v) == n}


# ----------------------------------------------------------------------------- one request


class _Transient(Exception):
    """A failure worth another try: no connection, a timeout, a 5xx or 429 answer."""


def post(url: str, data: bytes, settings: RemoteSettings) -> bytes:
    """The body of a 200 answer to POST `data`, retried `settings.retries` times on transient failures."""
    delay = settings.backoff
    for attempt in range(settings.retries + 1):
        try:
            return _post_once(url, data, settings)
        except _Transient as e:
            if attempt == settings.retries:
                tries = settings.retries + 1
                raise RewardError(f"reward server {url}: no answer after {tries} "
                                  f"{'try' if tries == 1 else 'tries'}: {e}") from None
        time.sleep(delay)
        delay = min(delay * 2, BACKOFF_CAP_S)
    raise AssertionError("unreachable")


def _post_once(url: str, data: bytes, settings: RemoteSettings) -> bytes:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    request = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with _opener(url).open(request, timeout=settings.timeout) as answer:
            return answer.read(MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as e:
        detail = _detail(e.read(4096))
        if e.code >= 500 or e.code == 429:
            raise _Transient(f"HTTP {e.code}{detail}") from None
        raise RewardError(f"reward server {url} refused the request: HTTP {e.code}{detail}") from None
    except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out (socket.timeout is an OSError)
        reason = getattr(e, "reason", None) or e
        raise _Transient(str(reason) or type(reason).__name__) from None


def _detail(body: bytes) -> str:
    """': MESSAGE' from an error answer (FastAPI's {"detail": ...} or the text's first line)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        found = json.loads(text)
        text = str(found.get("detail", text)) if isinstance(found, dict) else text
    except ValueError:
        pass
    line = text.splitlines()[0] if text else ""
    return f": {line[:200]}" if line else ""


# ----------------------------------------------------------------------------- the answer


def parse_rewards(url: str, body: bytes, n: int, offset: int, payload: Mapping[str, list]) -> list[float]:
    """The `n` rewards in an answer, or a RewardError naming `url` and the first bad item (sample
    numbers count from the batch's start: `offset` is the request's first sample)."""
    text = body.decode("utf-8", "replace").lstrip()
    if text[:1] == "<":
        raise RewardError(f"reward server {url} answered HTML, not JSON: {_short(text)}")
    try:
        answer = json.loads(text)
    except ValueError:
        raise RewardError(f"reward server {url} answered something that is not JSON: {_short(text)}") from None
    rewards = answer.get("rewards") if isinstance(answer, dict) else None
    if not isinstance(rewards, list):
        raise RewardError(f"reward server {url} answered {_short(text)}; expected {{\"rewards\": [one number "
                          "per sample]}")
    if len(rewards) != n:
        raise RewardError(f"reward server {url} answered {len(rewards)} rewards for {n} samples")
    out = []
    for i, value in enumerate(rewards):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            sample = f"sample {offset + i} (completion={_short(payload['completions'][i])})"
            raise RewardError(f"reward server {url} gave {_short(value)} for {sample}; expected a finite number")
        out.append(float(value))
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value) if _jsonable(value) else repr(value)
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------- the kind


def build_remote(spec: str, options: Mapping[str, Any]) -> RemoteReward:
    """The reward of ``reward=http(s)://HOST:PORT/PATH[+...]``: options read, every server reached once."""
    urls = parse_urls(spec)
    settings = settings_from(options, spec)
    for url in urls:
        check_reachable(url, spec, settings.timeout)
    return RemoteReward(urls, settings, spec)
