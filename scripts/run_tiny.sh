#!/usr/bin/env bash
# The README's run command: make a virtual environment, install sc_lightning, run the tiny GRPO example.
# Extra arguments go to the CLI (e.g. scripts/run_tiny.sh --dry_run). Library logs are quiet: SC_LIGHTNING_VERBOSE=1
# brings them back (RAY_LOGGER_LEVEL=info: only Ray's).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .
.venv/bin/python -m sc_lightning fit --config configs/grpo_tiny.yaml "$@"
