"""`rlhfkit serve MODEL`: an OpenAI-compatible server on a causal LM (rollout/openai_server.py).

    rlhfkit serve                                  # the built-in SmolLM2-135M-Instruct on 127.0.0.1:8000
    rlhfkit serve runs/grpo-x/final --port 0       # any free port; the ready line prints the URL
    rlhfkit serve org/model --host 0.0.0.0 --token SECRET

Once it listens it prints one line, `[serve] ready: http://HOST:PORT/v1 model=NAME`, and serves
until Ctrl-C or SIGTERM. Clients: any OpenAI client with base_url=that URL and api_key=the token
(any text on loopback without --token); `model` must be NAME (--name, default MODEL as given).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import threading

from rlhfkit.core.argv import OptionsHelpFormatter, parse_command_line
from rlhfkit.errors import UserError

TOKEN_VARIABLE = "RLHFKIT_SERVE_TOKEN"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(formatter_class=OptionsHelpFormatter, prog="rlhfkit serve",
                                description="Serve a causal LM through an OpenAI-compatible API (/v1/chat/completions, "
                                            "/v1/completions, /v1/models), batching concurrent requests.")
    p.add_argument("model", nargs="?", default="smollm2-135m-instruct",
                   help="model folder, a run's final/, a Hub id org/name, or the built-in default")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; any non-loopback one needs --token")
    p.add_argument("--port", type=int, default=8000, help="port (0: a free one, printed in the ready line)")
    p.add_argument("--token", default=None, help=f"access token clients send as their API key (default: "
                   f"${TOKEN_VARIABLE}); required off loopback")
    p.add_argument("--name", default=None, help="the model name clients must give (default: MODEL as written)")
    p.add_argument("--max-tokens", type=int, default=512, help="longest reply in tokens; larger max_tokens are capped")
    p.add_argument("--batch-window-ms", type=float, default=20.0,
                   help="requests arriving within this many ms of the first waiting one share a decoding loop")
    p.add_argument("--max-batch-rows", type=int, default=64, help="most rows (requests x n) in one decoding loop")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="weights and matmuls: auto = bf16 where bf16 matmuls are fast, else fp32")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampler's generator")
    p.add_argument("--verbose", action="store_true", help="log every request")
    return p


def check_options(a: argparse.Namespace, environ) -> str | None:
    """The access token to require (None: none); one-line UserErrors for bad numbers or a
    non-loopback address without a token."""
    from rlhfkit.rollout.openai_server import LOOPBACK

    if not 0 <= a.port <= 65535:
        raise UserError(f"--port {a.port}: expected 0-65535")
    if a.max_tokens < 1 or a.max_batch_rows < 1 or a.batch_window_ms < 0:
        raise UserError("--max-tokens and --max-batch-rows must be >= 1 and --batch-window-ms >= 0")
    token = a.token if a.token is not None else environ.get(TOKEN_VARIABLE)
    if token is not None and len(token) < 8:
        raise UserError(f"{'--token' if a.token is not None else TOKEN_VARIABLE}: use at least 8 characters")
    if a.host not in LOOPBACK and token is None:
        raise UserError(f"--host {a.host} is not a loopback address: give --token (or ${TOKEN_VARIABLE}) so only "
                        "your clients can use the model")
    return token


def build_server(a: argparse.Namespace, token: str | None):
    """The loaded model behind an OpenAIServer (not started)."""
    from rlhfkit.models.loading import load_causal_lm, load_tokenizer, resolve_dtype
    from rlhfkit.rollout.openai_server import Api, OpenAIServer, Served
    from rlhfkit.rollout.serving import BatchedSampler

    tok = load_tokenizer(a.model)
    model = load_causal_lm(a.model, resolve_dtype(a.dtype), trainable=False)
    window = int(getattr(model.config, "max_position_embeddings", 0) or 8192)
    sampler = BatchedSampler(model, (tok.eos_token_id,), tok.pad_token_id, window_s=a.batch_window_ms / 1000,
                             max_rows=a.max_batch_rows, seed=a.seed)
    served = Served(tok, sampler, a.name or a.model, a.max_tokens, max(1, window - a.max_tokens))
    try:
        return OpenAIServer(Api(served, token=token), a.host, a.port, verbose=a.verbose)
    except OSError as e:
        what = {errno.EADDRINUSE: f"--port {a.port}: already in use; choose another (0: any free port)",
                errno.EACCES: f"--port {a.port}: not allowed for this user; choose one above 1023"}.get(e.errno)
        raise UserError(what or f"cannot listen on {a.host}:{a.port} ({e.strerror or e})") from None


def main(argv: list[str]) -> int:
    a = parse_command_line(build_parser(), argv)
    token = check_options(a, os.environ)
    server = build_server(a, token)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with server:
        print(f"[serve] ready: {server.url}/v1 model={server.api.served.name}"
              f"{' token=required' if token else ''} (Ctrl-C stops)", flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    print("[serve] stopped", file=sys.stderr, flush=True)
    return 0
