#!/usr/bin/env bash
# On the GPU machine: install what its image lacks (scripts/gpu_env.sh), then run benchmarks/e2e.py, the real `fit`
# with 512 completions a step (32 prompts x 16), 256-token prompts and long-tailed answers (mean ~1K, max 4,096
# tokens), colocated on one GPU, at both benchmark shapes; each prints tokens/s/GPU, generated tok/s and the step
# split as soon as its fit ends, then the orchestration efficiency (its parts' benchmarks on the same work / the
# step's wall time):
#   1.26b     builtin:bench-1.26b, 2 steps (the first is the warm-up), at most 380 s (3 steps ran past 300 s)
#   llama1b   builtin:bench-llama1b (128K vocabulary, tied embeddings), 2 steps, in the time left
# E2E_SHAPES (default "1.26b llama1b") picks the shapes. The whole stays within E2E_TOTAL_S (default 560 s, under 10 minutes with the install). Each run is under `timeout`,
# which signals its whole process group (the fit dies with it), and its fit under a shorter --fit-timeout so the
# parts' benchmarks keep ~100 s. The async mode needs Ray and an engine actor on the GPU: the image has no Ray and the
# Ray engine actor takes no GPU, so it is not run here (`benchmarks/e2e.py --mode async` runs on a CPU box).
# Writes e2e-<shape>.txt (the printout), e2e-<shape>.json (results.json) and e2e-<shape>-fit.txt (the end of the
# fit's log) into $OUT.
set -uo pipefail  # one shape failing does not stop the other
out=${OUT:?set OUT to the folder the results go to}
total=${E2E_TOTAL_S:-560}
source "$(dirname "$0")/gpu_env.sh"
run() {  # shape, steps, seconds
  local shape=$1 steps=$2 limit=$3 dir=/tmp/sc_e2e_$1
  if ((limit < 150)); then echo "e2e $shape skipped: ${limit}s left" | tee "$out/e2e-$shape.txt"; return; fi
  timeout -k 10 "$limit" python3 benchmarks/e2e.py --shape "$shape" --steps "$steps" --out "$dir" \
    --fit-timeout $((limit - 100)) > "$out/e2e-$shape.txt" 2>&1
  echo "e2e $shape rc $? (limit ${limit}s)" >> "$out/e2e-$shape.txt"
  cp "$dir/results.json" "$out/e2e-$shape.json" 2>/dev/null
  tail -60 "$dir/fit.log" > "$out/e2e-$shape-fit.txt" 2>/dev/null
  grep -v -i "warn" "$out/e2e-$shape.txt" | tail -24
}
left() { echo $((total - SECONDS - 10)); }
shapes=${E2E_SHAPES:-1.26b llama1b}
if [[ " $shapes " == *" 1.26b "* ]]; then
  first=$(left)
  [[ " $shapes " == *" llama1b "* ]] && first=$((first < 380 ? first : 380))  # the rest is llama1b's
  run 1.26b 2 "$first"
fi
[[ " $shapes " != *" llama1b "* ]] || run llama1b 2 "$(left)"
