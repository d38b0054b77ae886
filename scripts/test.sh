#!/usr/bin/env bash
# One command: set up .venv (first time only), lint, and run the test suite on every core.
# Extra arguments go to pytest (e.g. -m "not slow" for the fast subset, -n 0 for one process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/ruff check --quiet src tests bench
exec .venv/bin/python -m pytest -n "${RLHFKIT_TEST_WORKERS:-auto}" "$@"
