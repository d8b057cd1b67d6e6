#!/usr/bin/env bash
# On the GPU machine: install what its image lacks (scripts/gpu_env.sh), run the GPU tests, then the GPU benchmarks
# (scripts/gpu_bench.sh; SC_GPU_BENCH=0 skips them). Extra arguments go to pytest.
#   scripts/gpu_check.sh                 # every test marked gpu, then the benchmarks
#   SC_GPU_BENCH=0 scripts/gpu_check.sh -k bf16         # some of the tests only
#   SC_GPU_BENCH=0 scripts/gpu_check.sh tests/gpu/test_megatron_optimizer.py   # one file
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
# GPU tests live in tests/gpu (the rest need Ray, absent here); arguments naming tests/... replace that default
targets=(tests/gpu)
for arg in "$@"; do [[ $arg == tests/* ]] && targets=(); done
python3 -m pytest -m gpu -p no:cacheprovider "$@" "${targets[@]}"
[[ ${SC_GPU_BENCH:-1} == 0 ]] || "$(dirname "$0")/gpu_bench.sh"
