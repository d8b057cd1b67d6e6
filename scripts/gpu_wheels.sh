#!/usr/bin/env bash
# On the CPU box: download, into .gpu_wheels/ (ignored by git), the wheels the GPU image lacks, for its Python 3.12.
# scripts/gpu_check.sh installs them there. Needs a package index; the GPU machine has none.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu_wheels
mkdir -p "$out"
pip=(python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any --dest "$out")
"${pip[@]}" megatron-core==0.16.1 \
  jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 \
  omegaconf==2.3.1 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
  pytest==9.2.0 pytest-timeout==2.4.0 iniconfig==2.3.1 pluggy==1.7.0 \
  hypothesis==6.170.17 sortedcontainers==2.4.0
# antlr4-python3-runtime 4.9.3 (omegaconf's pin) is published only as a source archive: build its pure wheel here
python3 -m pip wheel --quiet --no-deps --wheel-dir "$out" antlr4-python3-runtime==4.9.3
du -sh "$out"
