#!/usr/bin/env bash
# On the GPU machine: install what its image lacks (scripts/gpu_env.sh), then run benchmarks/e2e.py, the real `fit`
# with 512 completions a step (32 prompts x 16), 256-token prompts and long-tailed answers (mean ~1K, max 4,096
# tokens), colocated on one GPU, at both benchmark shapes; each prints tokens/s/GPU, generated tok/s and the step
# split as soon as its fit ends, then the orchestration efficiency (its parts' benchmarks on the same work / the
# step's wall time):
#   1.26b     builtin:bench-1.26b, 2 steps (the first is the warm-up), at most 380 s (3 steps ran past 300 s)
#   llama1b   builtin:bench-llama1b (128K vocabulary, tied embeddings), 2 steps, in the time left
# The environment picks: E2E_SHAPES (default "1.26b llama1b"), E2E_MODES (default "colocated"; "colocated
# colocated-async" compares one process on-policy with one step of lookahead on the same work, each shape's time
# split between them), E2E_STEPS (default 2), E2E_ARGS (more arguments for e2e.py, e.g. --no-parts). The whole stays
# within E2E_TOTAL_S (default 560 s, under 10 minutes with the install). Each run is under `timeout`, which signals
# its whole process group (the fit dies with it), and its fit under a shorter --fit-timeout so the parts'
# benchmarks keep ~100 s (20 s with --no-parts). The async mode needs Ray and an engine actor on the GPU: the image has no Ray and the Ray
# engine actor takes no GPU, so it is not run here (`benchmarks/e2e.py --mode async` runs on a CPU box).
# Writes e2e-<shape>[-<mode>].txt (the printout), .json (results.json) and -fit.txt (the end of the fit's log) into
# $OUT, the mode named unless colocated.
#   E2E_SHAPES=llama1b E2E_MODES="colocated colocated-async" E2E_STEPS=4 E2E_ARGS=--no-parts scripts/gpu_e2e.sh
set -uo pipefail  # one shape failing does not stop the other
out=${OUT:?set OUT to the folder the results go to}
total=${E2E_TOTAL_S:-560}
source "$(dirname "$0")/gpu_env.sh"
read -ra extra <<< "${E2E_ARGS:-}"
read -ra modes <<< "${E2E_MODES:-colocated}"
reserve=100  # seconds a run keeps after its fit for the parts' benchmarks
[[ " ${extra[*]} " != *" --no-parts "* ]] || reserve=20
run() {  # shape, mode, seconds
  local shape=$1 mode=$2 limit=$3 name=e2e-$1
  [[ $mode == colocated ]] || name+=-$mode
  local dir=/tmp/sc_$name
  if ((limit < 150)); then echo "$name skipped: ${limit}s left" | tee "$out/$name.txt"; return; fi
  timeout -k 10 "$limit" python3 benchmarks/e2e.py --shape "$shape" --mode "$mode" --steps "${E2E_STEPS:-2}" \
    --out "$dir" --fit-timeout $((limit - reserve)) "${extra[@]}" > "$out/$name.txt" 2>&1
  echo "$name rc $? (limit ${limit}s)" >> "$out/$name.txt"
  cp "$dir/results.json" "$out/$name.json" 2>/dev/null
  tail -60 "$dir/fit.log" > "$out/$name-fit.txt" 2>/dev/null
  grep -v -i "warn" "$out/$name.txt" | tail -24
}
left() { echo $((total - SECONDS - 10)); }
shape_runs() {  # shape, seconds: its modes, the time split between them
  local shape=$1 share=$(($2 / ${#modes[@]})) mode
  for mode in "${modes[@]}"; do run "$shape" "$mode" "$share"; done
}
shapes=${E2E_SHAPES:-1.26b llama1b}
if [[ " $shapes " == *" 1.26b "* ]]; then
  first=$(left)
  [[ " $shapes " == *" llama1b "* ]] && first=$((first < 380 ? first : 380))  # the rest is llama1b's
  shape_runs 1.26b "$first"
fi
[[ " $shapes " != *" llama1b "* ]] || shape_runs llama1b "$(left)"
