"""`rlhfkit serve-reward REWARD`: host any rlhfkit reward (sentiment, model:PATH, python:..., code, ...) as a
server in OpenRLHF's remote reward protocol (rewards/remote.py), so a reward model or verifier runs on
another machine and a run scores through ``reward=http://HOST:PORT/get_reward``.

POST PATH (default /get_reward), JSON ``{"query": [...], "prompts": [...], "labels": [...], COLUMN: [...]}``
-> ``{"rewards": [...]}``. The completion is the request's ``completions`` when it has them (rlhfkit's
client sends them), else each query with its prompt cut from the front (OpenRLHF's client sends the
prompt followed by the response). ``labels`` reach the reward as the keyword `--labels-as` (default
``answer``, what the arithmetic reward reads) unless the request has that column itself; every other
column of per-sample values reaches it by its name. GET /health answers ``{"reward": NAME}``.

Safety: it listens on 127.0.0.1 by default; on any other address an access token is required
(``--token`` or $RLHFKIT_REWARD_TOKEN, sent by clients as ``Authorization: Bearer TOKEN``; rlhfkit's
client sends it with ``reward_api_key_env=RLHFKIT_REWARD_TOKEN``). Requests must be JSON
(``Content-Type: application/json``, which a web page cannot send to it without CORS, which it does not
grant), at most `--max-request-mb` and `--max-batch` samples; a request must arrive whole within 10 s
of its connection opening (label/server.py's limits). A reward error answers 422 with its one line.
"""

# No `from __future__ import annotations` here: FastAPI reads the endpoints' annotations (Request) at
# definition time, inside make_app.
import argparse
import hmac
import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rlhfkit.core.argv import OptionsHelpFormatter, parse_command_line
from rlhfkit.errors import UserError
from rlhfkit.label.serve import listen

TOKEN_VARIABLE = "RLHFKIT_REWARD_TOKEN"
MIN_TOKEN_CHARS = 8


def build_parser() -> argparse.ArgumentParser:
    """The options of `rlhfkit serve-reward`."""
    p = argparse.ArgumentParser(formatter_class=OptionsHelpFormatter, prog="rlhfkit serve-reward",
                                description="Host a reward as a server in OpenRLHF's remote reward protocol "
                                            "(POST {query, prompts, labels} -> {rewards}).")
    p.add_argument("reward", help="the reward to host, as `reward=` takes it: sentiment, arithmetic, length[:N], "
                                  "model:PATH, python:FILE.py:FN, verl:FILE.py, openrlhf:FILE.py, code, ...")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; any non-loopback address needs an access token")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (0: a free one, printed at start)")
    p.add_argument("--path", default="/get_reward", help="the path that takes POST requests (OpenRLHF's)")
    p.add_argument("--token", default=None,
                   help=f"access token clients send as 'Authorization: Bearer TOKEN' (at least {MIN_TOKEN_CHARS} "
                        f"characters); prefer ${TOKEN_VARIABLE}, which `ps` does not show")
    p.add_argument("--labels-as", default="answer",
                   help="the keyword a request's labels reach the reward under, unless it sends that column itself")
    p.add_argument("--max-request-mb", type=float, default=16.0, help="largest request body, in MiB")
    p.add_argument("--max-batch", type=int, default=4096, help="most samples in one request")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's log level")
    return p


def check_options(a: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The access token (None: none), after the options' one-line checks."""
    from rlhfkit.label.security import is_loopback

    if not 0 <= a.port <= 65535:
        raise UserError(f"--port ({a.port}) must be in 0..65535")
    if not a.path.startswith("/"):
        raise UserError(f"--path ({a.path}) must start with /")
    if a.max_request_mb <= 0 or a.max_batch < 1:
        raise UserError("--max-request-mb must be > 0 and --max-batch >= 1")
    token = a.token if a.token is not None else environ.get(TOKEN_VARIABLE) or None
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise UserError(f"the access token must have at least {MIN_TOKEN_CHARS} characters")
    if token is None and not is_loopback(a.host):
        raise UserError(f"--host {a.host} is reachable from other machines: set an access token (${TOKEN_VARIABLE} "
                        "or --token), or listen on 127.0.0.1")
    return token


# ----------------------------------------------------------------------------- one request


def reward_call(body: Any, labels_as: str, max_batch: int) -> tuple[list, list, dict[str, list]]:
    """(prompts, completions, columns) of a request body, or a UserError saying what is wrong with it."""
    if not isinstance(body, dict):
        raise UserError("the request must be a JSON object {\"query\": [...], \"prompts\": [...], ...}")
    queries, prompts, completions = body.get("query"), body.get("prompts"), body.get("completions")
    texts = completions if completions is not None else queries
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise UserError("'query' (or 'completions') must be a list of texts")
    n = len(texts)
    if n > max_batch:
        raise UserError(f"{n} samples in one request; this server takes at most {max_batch} (--max-batch)")
    if prompts is None:
        prompts = [""] * n
    if not isinstance(prompts, list) or len(prompts) != n or not all(isinstance(p, str) for p in prompts):
        raise UserError(f"'prompts' must be a list of {n} texts, one per query")
    if completions is None:  # OpenRLHF's query is the prompt followed by the response
        completions = [q[len(p):] if p and q.startswith(p) else q for q, p in zip(queries, prompts)]
    columns = {k: v for k, v in body.items() if k not in ("query", "prompts", "completions", "labels")
               and isinstance(v, list) and len(v) == n}
    labels = body.get("labels")
    if isinstance(labels, list) and len(labels) == n and labels_as not in columns:
        columns[labels_as] = labels
    return prompts, completions, columns


def make_app(reward_fn: Callable, name: str, path: str, token: str | None, max_bytes: int, max_batch: int,
             labels_as: str) -> Any:
    """The FastAPI app: POST `path` scores, GET /health names the reward; one request scores at a time."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    from rlhfkit.rewards.scoring import score_batch

    app = FastAPI(title=f"rlhfkit reward {name}", docs_url=None, redoc_url=None, openapi_url=None)
    lock = threading.Lock()  # reward functions (a model on one device) need not be thread-safe

    def refused(request: Request) -> JSONResponse | None:
        sent = request.headers.get("authorization", "")
        if token is not None and not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return JSONResponse({"detail": "missing or wrong access token (Authorization: Bearer TOKEN)"}, 401)
        return None

    @app.get("/health")
    async def health(request: Request) -> Any:
        return refused(request) or {"reward": name}

    @app.post(path)
    async def score(request: Request) -> Any:
        if (answer := refused(request)) is not None:
            return answer
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"detail": "the request must be JSON (Content-Type: application/json)"}, 415)
        if int(request.headers.get("content-length") or 0) > max_bytes:
            return JSONResponse({"detail": f"request body larger than {max_bytes} bytes"}, 413)
        data = bytearray()
        async for chunk in request.stream():
            data += chunk
            if len(data) > max_bytes:
                return JSONResponse({"detail": f"request body larger than {max_bytes} bytes"}, 413)
        try:
            prompts, completions, columns = reward_call(json.loads(data), labels_as, max_batch)

            def run() -> list[float]:
                with lock:
                    return score_batch(reward_fn, prompts, completions, columns, name=name)

            return {"rewards": await run_in_threadpool(run)}
        except ValueError:
            return JSONResponse({"detail": "the request body is not valid JSON"}, 400)
        except UserError as e:
            return JSONResponse({"detail": " ".join(str(e).split())}, 422)

    return app


# ----------------------------------------------------------------------------- the command


def main(argv: list[str]) -> int:
    from rlhfkit.label.server import make_server
    from rlhfkit.rewards import get_reward
    from rlhfkit.rewards.scoring import reward_name

    a = parse_command_line(build_parser(), argv)
    token = check_options(a, os.environ)
    host = a.host.strip("[]")
    reward_fn = get_reward(a.reward)  # a bad spec, file or model: one line before anything listens
    name = reward_name(reward_fn)
    sock = listen(host, a.port)
    try:
        port = sock.getsockname()[1]
        app = make_app(reward_fn, name, a.path, token, int(a.max_request_mb * (1 << 20)), a.max_batch, a.labels_as)
        shown = f"[{host}]" if ":" in host else host
        auth = " (clients send Authorization: Bearer TOKEN)" if token else ""
        print(f"serving reward {name!r} at http://{shown}:{port}{a.path}{auth}; Ctrl-C stops", flush=True)
        make_server(app, log_level=a.log_level).run(sockets=[sock])
    finally:
        sock.close()
    return 0
