#!/usr/bin/env bash
# One command: set up .venv (first time only) and run the default demo, `rlhfkit ppo`.
# Extra arguments are passed to `rlhfkit ppo` (e.g. iterations=4).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec .venv/bin/rlhfkit ppo "$@"
