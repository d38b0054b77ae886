"""The OpenAI API's request checks and response shapes, for rollout/openai_server.py.

`parse_chat` and `parse_completion` turn a request body into a `Request` or raise `ApiError`
(an OpenAI-style error: status, message, the parameter it is about). What is supported:
`model` (the served name), `messages` / `prompt`, `n` (<= MAX_N), `temperature` (0-2), `max_tokens` /
`max_completion_tokens` (capped at the server's limit: finish_reason "length"), `stop` (up to 4
strings), `tools` (functions) with `tool_choice` auto/none, `logprobs`; `seed`, `user`,
`metadata`, `store`, `parallel_tool_calls`, `stream_options`, `service_tier` are accepted and
ignored (batched sampling cannot honour a per-request seed). Anything else, or a value the sampler
cannot honour (`stream`, `top_p` < 1, penalties, `logit_bias`, a JSON response format), is refused
with a 400 naming the parameter, never silently changed.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid

MAX_N = 16
MAX_STOPS = 4
ROLES = ("system", "developer", "user", "assistant", "tool")
IGNORED = frozenset({"seed", "user", "metadata", "store", "parallel_tool_calls", "stream_options", "service_tier"})
CHAT_KEYS = frozenset({"model", "messages", "n", "temperature", "max_tokens", "max_completion_tokens", "stop",
                       "tools", "tool_choice", "logprobs", "top_logprobs", "stream", "top_p", "presence_penalty",
                       "frequency_penalty", "logit_bias", "response_format"}) | IGNORED
COMPLETION_KEYS = frozenset({"model", "prompt", "n", "temperature", "max_tokens", "stop", "logprobs", "echo",
                             "stream", "top_p", "presence_penalty", "frequency_penalty", "logit_bias", "suffix",
                             "best_of"}) | IGNORED


class ApiError(Exception):
    """An OpenAI-style error response."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass
class Request:
    """A checked request: chat `messages` (or a `prompt` text) and how to sample."""

    n: int
    temperature: float
    max_tokens: int
    stop: list[str]
    logprobs: bool
    messages: list[dict] | None = None
    tools: list[dict] | None = None
    parse_tools: bool = False
    prompt: str | None = None


def _number(body: dict, key: str, default, low: float, high: float, integer: bool = False):
    value = body.get(key, default)
    if value is None:
        return default
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not (math.isfinite(value) and low <= value <= high):
        kind = "an integer" if integer else "a number"
        raise ApiError(400, f"'{key}' must be {kind} in [{low:g}, {high:g}], got {value!r}", key, "invalid_value")
    return value


def _refuse_unsupported(body: dict, keys: frozenset) -> None:
    unknown = sorted(k for k in body if k not in keys)
    if unknown:
        raise ApiError(400, f"unsupported parameter '{unknown[0]}'", unknown[0], "unsupported_parameter")
    checks = [("stream", bool(body.get("stream")), "streaming is not supported: call without stream"),
              ("top_p", body.get("top_p") not in (None, 1, 1.0), "only top_p=1 is supported (the full distribution)"),
              ("presence_penalty", body.get("presence_penalty") not in (None, 0, 0.0), "penalties are not supported"),
              ("frequency_penalty", body.get("frequency_penalty") not in (None, 0, 0.0), "penalties are not supported"),
              ("logit_bias", bool(body.get("logit_bias")), "logit_bias is not supported"),
              ("echo", bool(body.get("echo")), "echo is not supported"),
              ("suffix", bool(body.get("suffix")), "suffix is not supported"),
              ("best_of", body.get("best_of") not in (None, 1), "best_of is not supported"),
              ("top_logprobs", body.get("top_logprobs") not in (None, 0), "top_logprobs is not supported"),
              ("response_format", (body.get("response_format") or {"type": "text"}).get("type") != "text"
               if isinstance(body.get("response_format") or {}, dict) else True, "only text responses are supported")]
    for key, bad, message in checks:
        if bad:
            raise ApiError(400, message, key, "unsupported_parameter")


def _common(body: dict, served: str, max_tokens_limit: int, default_max: int) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model != served:
        raise ApiError(404, f"The model '{model}' does not exist: this server serves '{served}'", "model",
                       "model_not_found")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stop, list) or len(stop) > MAX_STOPS or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, f"'stop' must be a string or a list of up to {MAX_STOPS} non-empty strings", "stop")
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _number({key: asked}, key, default_max, 1, 1 << 30, integer=True)
    return {"n": _number(body, "n", 1, 1, MAX_N, integer=True),
            "temperature": float(_number(body, "temperature", 1.0, 0, 2)),
            "max_tokens": min(max_tokens, max_tokens_limit), "stop": stop}


def _check_messages(messages: object) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(400, f"messages[{i}] must be an object with a role in {', '.join(ROLES)}", "messages")
        content = m.get("content")
        if not (content is None or isinstance(content, (str, list))):
            raise ApiError(400, f"messages[{i}].content must be a string, null or a list of parts", "messages")
    return [{**m, "role": "system" if m["role"] == "developer" else m["role"]} for m in messages]


def _check_tools(body: dict) -> tuple[list[dict] | None, bool]:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise ApiError(400, "only tool_choice 'auto' and 'none' are supported", "tool_choice", "unsupported_parameter")
    if tools is None:
        return None, False
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function"
                                              and isinstance((t.get("function") or {}).get("name"), str) for t in tools):
        raise ApiError(400, "'tools' must be a list of {'type': 'function', 'function': {'name': ...}}", "tools")
    return tools or None, bool(tools) and choice != "none"


def parse_chat(body: dict, served: str, max_tokens_limit: int) -> Request:
    """A /v1/chat/completions body as a Request, or ApiError."""
    _refuse_unsupported(body if isinstance(body, dict) else {}, CHAT_KEYS)
    common = _common(body, served, max_tokens_limit, max_tokens_limit)
    tools, parse = _check_tools(body)
    return Request(**common, logprobs=bool(body.get("logprobs")), messages=_check_messages(body.get("messages")),
                   tools=tools, parse_tools=parse)


def parse_completion(body: dict, served: str, max_tokens_limit: int) -> Request:
    """A /v1/completions body as a Request, or ApiError (one prompt string per request)."""
    _refuse_unsupported(body if isinstance(body, dict) else {}, COMPLETION_KEYS)
    common = _common(body, served, max_tokens_limit, min(16, max_tokens_limit))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "'prompt' must be one non-empty string", "prompt")
    lp = body.get("logprobs")  # the number of top log-probs; the sampled token's own is returned for any
    return Request(**common, logprobs=lp is True or (isinstance(lp, int) and not isinstance(lp, bool)), prompt=prompt)


# ----------------------------------------------------------------------------- responses


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_response(served: str, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": int(time.time()),
            "model": served, "choices": choices, "usage": usage(prompt_tokens, completion_tokens),
            "system_fingerprint": None}


def completion_response(served: str, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
    return {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
            "model": served, "choices": choices, "usage": usage(prompt_tokens, completion_tokens)}


def models_response(served: str) -> dict:
    return {"object": "list", "data": [{"id": served, "object": "model", "created": 0, "owned_by": "rlhfkit"}]}
