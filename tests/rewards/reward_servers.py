"""Real reward servers for the remote-reward tests, each its own process on a free loopback port:

- `scripted_server(mode)`: a standard-library HTTP server that answers OpenRLHF's protocol as told
  (right, or with a wrong count, NaN, text, HTML, 503s, slowly ...) and logs every request body; it
  also answers OpenAI's /v1/models and /v1/chat/completions as a parrot (the reply is the user message);
- `rlhfkit_process(argv)`: an `rlhfkit` command (serve-reward, serve) whose first stdout line names its URL.

Every wait is bounded in time; every process is stopped when its `with` block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 120.0  # an import of torch and transformers on a loaded 2-core machine

SCRIPT = r'''
import json, math, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

mode, log = sys.argv[1], sys.argv[2]
lock = threading.Lock()
seen = [0]

def rewards_of(body):
    texts = body.get("completions") or body.get("query") or []
    return [float(len(t)) for t in texts]

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, text, ctype="application/json"):
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            return self.answer(200, json.dumps({"object": "list", "data": [
                {"id": "parrot", "object": "model", "created": 0, "owned_by": "tests"}]}))
        self.answer(404, '{"detail": "Not Found"}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with lock:
            seen[0] += 1
            count = seen[0]
            with open(log, "a") as f:
                f.write(json.dumps({"path": self.path, "auth": self.headers.get("Authorization"),
                                    "body": body}) + "\n")
        if self.path == "/v1/chat/completions":  # an OpenAI-compatible parrot: the reply is the user message
            text = body["messages"][-1]["content"]
            return self.answer(200, json.dumps({
                "id": "chatcmpl-%d" % count, "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}))
        rewards = rewards_of(body)
        kind, _, arg = mode.partition(":")
        if kind == "flaky" and count <= int(arg):
            return self.answer(503, '{"detail": "warming up"}')
        if kind == "slow":
            time.sleep(float(arg))
        if kind == "count":
            rewards = rewards + [0.0]
        if kind == "nan":  # NaN for the completion `arg`, else for the last sample
            texts = body.get("completions") or []
            bad = [i for i, t in enumerate(texts) if t == arg] if arg else [len(rewards) - 1]
            return self.answer(200, '{"rewards": [%s]}' % ", ".join("NaN" if i in bad else "1.0"
                                                                    for i in range(len(rewards))))
        if kind == "string":
            rewards = rewards[:-1] + ["abc"]
        if kind == "bool":
            rewards = rewards[:-1] + [True]
        if kind == "html":
            return self.answer(200, "<!doctype html><html><body>Bad gateway</body></html>", "text/html")
        if kind == "notjson":
            return self.answer(200, "rewards: 1, 2")
        if kind == "nokey":
            return self.answer(200, json.dumps({"scores": rewards}))
        if kind == "refuse":
            return self.answer(400, '{"detail": "no such reward"}')
        self.answer(200, json.dumps({"rewards": rewards}))

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print("PORT", server.server_address[1], flush=True)
server.serve_forever()
'''


def _first_line(proc: subprocess.Popen, timeout: float, pattern: str = "") -> str:
    """The process's first stdout line that holds `pattern` (a regex), waiting at most `timeout` seconds."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buf = b""
    while True:
        lines = buf.decode(errors="replace").split("\n")
        found = [line for line in lines[:-1] if re.search(pattern, line)]
        if found:
            return found[0]
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"no start line within {timeout:.0f} s (exit code {proc.poll()}): {buf[-2000:]!r}")
        if sel.select(min(left, 1.0)):
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                proc.wait(10)
                raise RuntimeError(f"exited with {proc.returncode} before starting: {buf[-2000:]!r}")
            buf += chunk


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc.stdout:
        proc.stdout.close()


class Scripted:
    """A running scripted server: `url(path)` and the request bodies it saw (`requests()`)."""

    def __init__(self, port: int, log: Path):
        self.port, self.log = port, log

    def url(self, path: str = "/get_reward") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def requests(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@contextlib.contextmanager
def scripted_server(mode: str, tmp_path: Path) -> Iterator[Scripted]:
    log = tmp_path / f"requests-{mode.replace(':', '_')}-{time.monotonic_ns()}.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, mode, str(log)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        port = int(_first_line(proc, 30.0).split()[1])
        yield Scripted(port, log)
    finally:
        _stop(proc)


@contextlib.contextmanager
def rlhfkit_process(argv: list[str], env: dict[str, str] | None = None) -> Iterator[str]:
    """Run `rlhfkit ARGV`; yield the first URL it prints (its start line)."""
    full_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", **(env or {})}
    src = str(Path(__file__).resolve().parents[2] / "src")
    full_env["PYTHONPATH"] = os.pathsep.join([src, full_env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-m", "rlhfkit.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env)
    try:
        line = _first_line(proc, START_TIMEOUT_S, r"https?://")
        found = re.search(r"https?://\S+", line)
        if found is None:
            raise RuntimeError(f"no URL in the start line {line!r}")
        yield found.group(0).rstrip(";,")
    finally:
        _stop(proc)
