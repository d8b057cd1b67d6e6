#!/usr/bin/env bash
# On the GPU machine, in one call: what issue 16 measures. The one-GPU example's learning run (scripts/gpu_learn.sh,
# its own site directory) runs beside the GPU tests; the benchmarks (scripts/gpu_bench.sh) run after both, alone on
# the GPU. Writes few files into $OUT (a device call brings back only a handful): tests.txt, learn.txt, run-1.csv,
# bench.txt; prints a summary of each. Arguments are gpu_learn.sh's variants (each run's CSV comes back as run-N.csv).
#   scripts/gpu_all.sh                                              # the shipped example
#   scripts/gpu_all.sh "" "--grpo.num_generations_per_prompt 16"    # it and a variant, side by side
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT to the folder the results go to}
( SC_GPU_SITE=/tmp/sc_lightning_learn_site OUT=/tmp/sc_lightning_learn LIMIT_S=${LIMIT_S:-600} \
    scripts/gpu_learn.sh "$@" > "$out/learn.txt" 2>&1
  cp /tmp/sc_lightning_learn/run-*.csv "$out/" 2>/dev/null ) &
SC_GPU_BENCH=0 timeout "${TESTS_S:-300}" scripts/gpu_check.sh -q > "$out/tests.txt" 2>&1
echo "tests rc $?" >> "$out/tests.txt"
wait
timeout "${BENCH_S:-300}" scripts/gpu_bench.sh > "$out/bench.txt" 2>&1
echo "bench rc $?" >> "$out/bench.txt"
tail -3 "$out/tests.txt"
grep "run-\|climb" "$out/learn.txt"
grep "^|\|GRPO step /\|fused SwiGLU\|decode attention:\|x memcpy\|^[0-9]*M \|rc " "$out/bench.txt" | grep -v "^| *[a-zA-Z_:.]*  "
