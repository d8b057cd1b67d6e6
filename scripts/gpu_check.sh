#!/usr/bin/env bash
# On the GPU machine: install what its image lacks from .gpu_wheels/ (scripts/gpu_wheels.sh downloads them on a box
# with a package index; the GPU machine has none), then run the GPU tests. Extra arguments go to pytest.
#   scripts/gpu_check.sh                 # every test marked gpu
#   scripts/gpu_check.sh -k bf16         # some of them
#   scripts/gpu_check.sh tests/gpu/test_mixed_precision.py   # one file
set -euo pipefail
cd "$(dirname "$0")/.."
site=${SC_GPU_SITE:-/tmp/sc_lightning_site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu_wheels/*.whl
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, lightning, megatron.core as m; print('torch', torch.__version__, 'lightning', lightning.__version__, 'megatron-core', m.__version__)"
# GPU tests live in tests/gpu (the rest need Ray, absent here); arguments naming tests/... replace that default
targets=(tests/gpu)
for arg in "$@"; do [[ $arg == tests/* ]] && targets=(); done
python3 -m pytest -m gpu -p no:cacheprovider "$@" "${targets[@]}"
