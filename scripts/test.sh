#!/usr/bin/env bash
# The README's test command: make a virtual environment, install sc_lightning with its test extras, run the suite.
# Needs only Python 3.11 and pip. Extra arguments go to pytest (e.g. scripts/test.sh -k cli).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
.venv/bin/python -m ruff check .
.venv/bin/python -m pytest "$@"
