"""An OpenAI-compatible HTTP server on one causal LM: `/v1/chat/completions`, `/v1/completions`,
`/v1/models` (request rules: rollout/openai_api.py). `rlhfkit serve MODEL` runs it on its own;
agent rollouts (rollout/agent.py) run it on the policy being trained, with one episode per API key.

- Sampling: every request's rows go to one `BatchedSampler` (rollout/serving.py), which batches
  requests that arrive within a short window into one decoding loop.
- Chat: messages through the model's chat template, tool schemas and calls as rollout/chat_ids.py
  maps them; a reply's `<tool_call>` blocks come back as OpenAI `tool_calls` when the request
  had tools.
- Episodes (`open_episode`): a request made with an episode's key is recorded in it (prompt ids,
  sampled ids, log-probs: rollout/episodes.py), the episode's earlier replies are spliced into
  its prompt as the ids that were sampled, and a request the server refuses is noted with its
  reason. With episodes on, only episode keys are accepted.
- Access: on a loopback address anyone on this machine may call unless `token` is set; on any
  other address `token` is required (`Authorization: Bearer TOKEN`). On loopback the Host header
  must name a loopback host (no DNS rebinding from a browser page). Bodies over 1 MiB are refused,
  and a request waits at most `request_timeout_s` for its samples.
- Threads: a standard-library threading HTTP server; `close()` stops it and the sampler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hmac
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rlhfkit.rollout.chat_ids import encode, parse_tool_calls, prompt_ids, reply_key
from rlhfkit.rollout.episodes import Call, EpisodeRecord
from rlhfkit.rollout.openai_api import (
    ApiError,
    Request,
    chat_response,
    completion_response,
    models_response,
    parse_chat,
    parse_completion,
)
from rlhfkit.rollout.serving import BatchedSampler, Sample

MAX_BODY = 1 << 20
LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclasses.dataclass
class Served:
    """What the server hosts: the tokenizer, the sampler on the model, the name clients give as
    `model`, the longest reply (`max_tokens` is capped there) and the longest prompt in tokens.
    `temperature`: when set (training), every request samples at it, whatever it asked."""

    tokenizer: object
    sampler: BatchedSampler
    name: str
    max_tokens: int
    max_prompt_tokens: int
    temperature: float | None = None
    fmt: object = None  # prompt-format options (chat_template, system_prompt)


def cut_at_stop(tokenizer, sample: Sample, stops: list[str]) -> tuple[Sample, str, str]:
    """(the sample up to where its text first contains a stop string, its text, finish_reason).
    The text leaves out the stop token and the stop string; finish_reason is "stop" or "length"."""
    ids = list(sample.ids[:-1] if sample.stopped else sample.ids)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    hits = [text.index(s) for s in stops if s in text]
    if not hits:
        return sample, text, "stop" if sample.stopped else "length"
    k = next(k for k in range(1, len(ids) + 1) if any(s in tokenizer.decode(ids[:k], skip_special_tokens=True)
                                                      for s in stops))
    cut = Sample(sample.ids[:k], sample.logprobs[:k], True)
    return cut, text[: min(hits)], "stop"


class Api:
    """The requests' logic, free of HTTP: `handle(path, body, key)` -> (status, JSON body)."""

    def __init__(self, served: Served, token: str | None = None, episodes: bool = False,
                 max_calls_per_episode: int = 64, request_timeout_s: float = 600.0):
        self.served, self.token, self.episodes_on = served, token, episodes
        self.max_calls, self.timeout_s = max_calls_per_episode, request_timeout_s
        self.episodes: dict[str, EpisodeRecord] = {}
        self.lock = threading.Lock()

    # ---- episodes -----------------------------------------------------------------------------
    def open_episode(self) -> EpisodeRecord:
        record = EpisodeRecord(secrets.token_urlsafe(24))
        with self.lock:
            self.episodes[record.key] = record
        return record

    def close_episode(self, record: EpisodeRecord) -> None:
        record.closed = True
        with self.lock:
            self.episodes.pop(record.key, None)

    def episode_of(self, key: str | None) -> EpisodeRecord | None:
        """The caller's episode (episodes on), or None; ApiError 401 when the key is not accepted."""
        if self.episodes_on:
            with self.lock:
                record = self.episodes.get(key or "")
            if record is None or record.closed:
                raise ApiError(401, "unknown or expired API key: each agent episode has its own key", code="invalid_api_key")
            return record
        if self.token is not None and not hmac.compare_digest((key or "").encode(), self.token.encode()):
            raise ApiError(401, "missing or wrong API key (Authorization: Bearer TOKEN)", code="invalid_api_key")
        return None

    # ---- requests -----------------------------------------------------------------------------
    def handle(self, method: str, path: str, body: object, key: str | None) -> tuple[int, dict]:
        record = None
        if method == "GET" and path.rstrip("/") in ("/health", "/v1/health"):  # readiness, open to all: it tells nothing
            return 200, {"status": "ok"}
        try:
            record = self.episode_of(key)
            if method == "GET" and path.rstrip("/") == "/v1/models":
                return 200, models_response(self.served.name)
            if method != "POST" or path.rstrip("/") not in ("/v1/chat/completions", "/v1/completions"):
                raise ApiError(404, f"no such endpoint: {method} {path}")
            if record is not None and len(record.calls) + len(record.rejected) >= self.max_calls:
                raise ApiError(429, f"this episode made {self.max_calls} calls, the most one may make", code="call_limit")
            if path.rstrip("/") == "/v1/chat/completions":
                return 200, self.chat(parse_chat(body, self.served.name, self.served.max_tokens), record)
            return 200, self.completion(parse_completion(body, self.served.name, self.served.max_tokens), record)
        except ApiError as e:
            if record is not None and e.status != 401:
                record.refuse(f"{e.status} {e.message}")
            return e.status, e.body()

    def sample(self, prompt: list[int], req: Request) -> list[Sample]:
        served = self.served
        if len(prompt) > served.max_prompt_tokens:
            raise ApiError(400, f"the prompt has {len(prompt)} tokens, more than the {served.max_prompt_tokens} this "
                           "server takes", "messages", "context_length_exceeded")
        temperature = req.temperature if served.temperature is None else served.temperature
        future = served.sampler.submit(prompt, req.n, temperature, req.max_tokens)
        try:
            return future.result(timeout=self.timeout_s)
        except TimeoutError:
            raise ApiError(503, f"sampling took longer than {self.timeout_s:g} s") from None
        except RuntimeError as e:
            raise ApiError(503, f"the sampler stopped: {e}") from None

    def chat(self, req: Request, record: EpisodeRecord | None) -> dict:
        tok = self.served.tokenizer
        try:
            ids = prompt_ids(tok, req.messages, req.tools, record.known if record else None, self.served.fmt)
        except Exception as e:  # noqa: BLE001 - a template that rejects the conversation
            raise ApiError(400, f"the chat template rejected the messages: {e}", "messages") from None
        samples = self.sample(ids, req)
        choices, kept, keys, stops = [], [], [], []
        for i, s in enumerate(samples):
            s, text, finish = cut_at_stop(tok, s, req.stop)
            content, calls = parse_tool_calls(text) if req.parse_tools else (text, [])
            message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            lp = {"content": [{"token": tok.decode([t]), "logprob": v, "bytes": None, "top_logprobs": []}
                              for t, v in zip(s.ids, s.logprobs)]} if req.logprobs else None
            choices.append({"index": i, "message": message, "finish_reason": "tool_calls" if calls else finish,
                            "logprobs": lp})
            kept.append(s)
            keys.append(reply_key(content, calls))
            ended = s.stopped and s.ids and s.ids[-1] in self.served.sampler.stop_ids  # on a stop token, not a string
            stops.append(tok.decode(list(s.ids[-1:])) if ended else "")
        if record is not None:
            record.add(Call(tuple(ids), tuple(kept)), keys, stops)
        return chat_response(self.served.name, choices, len(ids), sum(len(s.ids) for s in kept))

    def completion(self, req: Request, record: EpisodeRecord | None) -> dict:
        tok = self.served.tokenizer
        ids = encode(tok, req.prompt)
        samples = self.sample(ids, req)
        choices, kept = [], []
        for i, s in enumerate(samples):
            s, text, finish = cut_at_stop(tok, s, req.stop)
            lp = {"tokens": [tok.decode([t]) for t in s.ids], "token_logprobs": list(s.logprobs), "top_logprobs": None,
                  "text_offset": None} if req.logprobs else None
            choices.append({"index": i, "text": text, "finish_reason": finish, "logprobs": lp})
            kept.append(s)
        if record is not None:
            record.add(Call(tuple(ids), tuple(kept)), [], [])
        return completion_response(self.served.name, choices, len(ids), sum(len(s.ids) for s in kept))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 120  # seconds to read a request (the socket's timeout)

    def log_message(self, format, *args):  # noqa: A002 - quiet unless the server says otherwise
        if self.server.verbose:
            super().log_message(format, *args)

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client left first (a timed-out episode's): no one to tell
            self.close_connection = True

    def _key(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[7:].strip() if auth.lower().startswith("bearer ") else None

    def _host_ok(self) -> bool:
        """Off loopback any Host; on loopback only a loopback name (a page elsewhere cannot rebind to us)."""
        if not self.server.loopback:
            return True
        header = self.headers.get("Host") or ""
        host = header[1:].split("]")[0] if header.startswith("[") else header.rsplit(":", 1)[0]
        return host in LOOPBACK

    def _serve(self, method: str) -> None:
        if not self._host_ok():
            return self._reply(403, ApiError(403, "Host header must name a loopback host").body())
        body: object = None
        if method == "POST":
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_BODY:
                self.close_connection = True
                return self._reply(413, ApiError(413, f"request body over {MAX_BODY} bytes").body())
            try:
                body = json.loads(self.rfile.read(size) or b"null")
            except ValueError:
                return self._reply(400, ApiError(400, "the request body is not JSON").body())
        self._reply(*self.server.api.handle(method, self.path.split("?")[0], body, self._key()))

    def do_GET(self):  # noqa: N802
        self._serve("GET")

    def do_POST(self):  # noqa: N802
        self._serve("POST")


class OpenAIServer:
    """`Api` behind a threading HTTP server on (host, port) (port 0: a free one; `url` says which).
    Use as a context manager, or `start()` / `close()`."""

    def __init__(self, api: Api, host: str = "127.0.0.1", port: int = 0, verbose: bool = False):
        loopback = host in LOOPBACK
        if not loopback and api.token is None and not api.episodes_on:
            raise ValueError(f"host {host} is not a loopback address: an access token is required")
        cls = type("Server", (ThreadingHTTPServer,), {"address_family": _family(host), "daemon_threads": True,
                                                       "request_queue_size": 256})  # many agents connect at once
        self.httpd = cls((host, port), _Handler)
        self.httpd.api, self.httpd.loopback, self.httpd.verbose = api, loopback, verbose
        self.api = api
        self._thread: threading.Thread | None = None
        h, p = self.httpd.server_address[:2]
        self.url = f"http://[{h}]:{p}" if ":" in h else f"http://{h}:{p}"

    def start(self) -> OpenAIServer:
        self.api.served.sampler.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="rlhfkit-openai-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.httpd.shutdown()
        self.httpd.server_close()
        self.api.served.sampler.close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _family(host: str):
    import socket

    return socket.AF_INET6 if ":" in host else socket.AF_INET
