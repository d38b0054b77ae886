#!/usr/bin/env bash
# One command: set up .venv (first time only) and run the test suite.
# Extra arguments go to pytest (e.g. -m "not slow" for the fast subset).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest "$@"
