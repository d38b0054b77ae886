"""Start `rlhfkit serve` as a real process on 127.0.0.1 for tests, and stop it (see
/work/helpers notes: `serving(model_dir)` yields the base URL ending in /v1)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

READY = re.compile(r"\[serve\] ready: (http://\S+/v1) model=(\S+)")


@contextlib.contextmanager
def serving(model: str | Path, *extra: str, timeout_s: float = 90.0):
    """(base_url, model name) of `rlhfkit serve MODEL --port 0 ...` once it answers /health; the
    process is stopped (SIGTERM, then killed) when the block ends."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    src = Path(__file__).resolve().parents[2] / "src"
    env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.Popen([sys.executable, "-m", "rlhfkit.cli", "serve", str(model), "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url, name, seen = None, None, []
        deadline = time.monotonic() + timeout_s
        while url is None and time.monotonic() < deadline:  # bounded: one line at a time until the deadline
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                raise RuntimeError("rlhfkit serve exited: " + "".join(seen)[-2000:])
            seen.append(line)
            m = READY.search(line)
            if m:
                url, name = m.group(1), m.group(2)
        if url is None:
            raise RuntimeError("rlhfkit serve printed no ready line in time: " + "".join(seen)[-2000:])
        with urllib.request.urlopen(url[: -len("/v1")] + "/health", timeout=10) as r:
            assert r.status == 200
        yield url, name
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
