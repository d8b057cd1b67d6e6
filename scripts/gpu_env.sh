# Sourced by the scripts/gpu_*.sh entry points on the GPU machine: install what its image lacks from .gpu_wheels/
# (scripts/gpu_wheels.sh downloads them on a box with a package index; the GPU machine has none) into a site
# directory, put it and the checkout on PYTHONPATH, and print what the run has.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
site=${SC_GPU_SITE:-/tmp/sc_lightning_site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu_wheels/*.whl
for bundle in .gpu_wheels/ray-*-slim.tar.xz; do  # Ray, when brought (SC_GPU_RAY=1 scripts/gpu_wheels.sh)
  if [[ -e $bundle && ! -d $site/ray ]]; then tar -xJf "$bundle" -C "$site"; fi
done
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}" NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, lightning, megatron.core as m; print('torch', torch.__version__, 'lightning', lightning.__version__, 'megatron-core', m.__version__)"
if [[ -d $site/ray ]]; then python3 -c "import ray; print('ray', ray.__version__)"; fi
