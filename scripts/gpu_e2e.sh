#!/usr/bin/env bash
# On the GPU machine: install what its image lacks (scripts/gpu_env.sh), then run benchmarks/e2e.py, the real `fit`
# with 512 completions a step (32 prompts x 16), 256-token prompts and long-tailed answers (mean ~1K, max 4,096
# tokens), colocated on one GPU, at both benchmark shapes; each prints tokens/s/GPU, generated tok/s, the step split
# and the orchestration efficiency (its parts' benchmarks on the same work / the step's wall time):
#   1.26b     builtin:bench-1.26b, 3 steps (the first is the warm-up)   under E2E_126B_S (default 270 s)
#   llama1b   builtin:bench-llama1b (128K vocabulary, tied), 2 steps    under E2E_LLAMA_S (default 230 s)
# The async mode needs Ray and an engine actor on the GPU: the image has no Ray and the Ray engine runs on the CPU,
# so it is not run here (benchmarks/e2e.py --mode async runs on a CPU box). Writes e2e-<shape>.txt (the printout),
# e2e-<shape>.json (results.json) and e2e-<shape>-fit.txt (the end of the fit's log) into $OUT. Total <= 9 minutes.
set -uo pipefail  # one shape failing does not stop the other
out=${OUT:?set OUT to the folder the results go to}
source "$(dirname "$0")/gpu_env.sh"
run() {  # shape, seconds, steps: the whole benchmark under `timeout` (its process group: the fit dies with it)
  local shape=$1 limit=$2 steps=$3 dir=/tmp/sc_e2e_$1
  timeout -k 10 "$limit" python3 benchmarks/e2e.py --shape "$shape" --steps "$steps" --out "$dir" \
    --fit-timeout $((limit - 75)) > "$out/e2e-$shape.txt" 2>&1
  echo "e2e $shape rc $?" >> "$out/e2e-$shape.txt"
  cp "$dir/results.json" "$out/e2e-$shape.json" 2>/dev/null
  tail -60 "$dir/fit.log" > "$out/e2e-$shape-fit.txt" 2>/dev/null
  grep -v -i "warn" "$out/e2e-$shape.txt" | tail -22
}
run 1.26b "${E2E_126B_S:-270}" 3
run llama1b "${E2E_LLAMA_S:-230}" 2
