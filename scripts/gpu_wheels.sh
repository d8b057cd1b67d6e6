#!/usr/bin/env bash
# On the CPU box: download, into .gpu_wheels/ (ignored by git), the wheels the GPU image lacks, for its Python 3.12.
# scripts/gpu_check.sh installs them there. Needs a package index; the GPU machine has none.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.gpu_wheels
mkdir -p "$out"
pip=(python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any)
"${pip[@]}" --dest "$out" megatron-core==0.16.1 \
  jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 \
  omegaconf==2.3.1 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
  pytest==9.2.0 pytest-timeout==2.4.0 iniconfig==2.3.1 pluggy==1.7.0 \
  hypothesis==6.170.17 sortedcontainers==2.4.0
# antlr4-python3-runtime 4.9.3 (omegaconf's pin) is published only as a source archive: build its pure wheel here
python3 -m pip wheel --quiet --no-deps --wheel-dir "$out" antlr4-python3-runtime==4.9.3
if [[ ${SC_GPU_RAY:-0} == 1 ]]; then
  # Ray for runs with engine actors (SC_GPU_RAY=1). Its wheel (79 MB) is over what a device call carries (64 MiB
  # in all): unpacked without its Java jars and RLlib, as .tar.xz, it is ~32 MB; scripts/gpu_env.sh unpacks it into
  # the site directory. Its dependencies the image lacks come as wheels beside it.
  "${pip[@]}" --dest "$out" click==8.5.1 jsonschema==4.26.0 attrs==26.1.0 jsonschema-specifications==2025.9.1 \
    referencing==0.37.0 rpds-py==2026.9.1 msgpack==1.2.4 protobuf==7.36.2
  ray=$(mktemp -d)
  "${pip[@]}" --dest "$ray" ray==2.60.0
  (cd "$ray" && unzip -q ./ray-*.whl -x 'ray/jars/*' 'ray/rllib/*' && rm ./ray-*.whl \
     && tar -cf - ray ray-*.dist-info | xz -6 -T2 > ray-slim.tar.xz)
  mv "$ray/ray-slim.tar.xz" "$out/ray-2.60.0-slim.tar.xz"
  rm -rf "$ray"
fi
du -sh "$out"
