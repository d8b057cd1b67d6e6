#!/usr/bin/env bash
# On the GPU machine: issue 37's long-answer example, timed as one device call. Installs what the image lacks
# (scripts/gpu_env.sh), builds the 312M warm start afresh (printing its time; KEEP_WARM=1 reuses a cached one), then
# runs `fit` on configs/grpo_1gpu_long.yaml in what is left of LIMIT_S (default 585 s, the whole script's wall),
# once per variant given (each a string of extra fit arguments; none: the config as shipped), side by side on the one
# GPU (so each is slower than alone). It writes into $OUT (or ./results/gpu_long): warm.txt, and per run N
# run-N-fit.log, run-N-metrics.csv and run-N-summary.txt, whose second line is "first5 X last5 Y climb Z steps N wall
# S" (S: seconds since the script started); summary.txt gathers them. Every step has a deadline: a stuck warm start
# or fit is killed, and the script then exits non-zero, saying which.
#   scripts/gpu_long.sh
#   FIT_ARGS="--policy.optimizer.lr 1e-5" LIMIT_S=580 scripts/gpu_long.sh
#   scripts/gpu_long.sh "--policy.optimizer.lr 1e-4" "--policy.optimizer.lr 3e-4"   # a sweep, side by side
#   CONFIG=configs/grpo_1gpu.yaml scripts/gpu_long.sh             # another config, timed the same way
set -euo pipefail
start=$(date +%s)
limit=${LIMIT_S:-585}  # the shipped config: ~150 s warm start + ~420 s fit; a device call has 600
config=${CONFIG:-configs/grpo_1gpu_long.yaml}
read -ra extra <<< "${FIT_ARGS:-}"
source "$(dirname "$0")/gpu_env.sh"  # from here on, in the checkout
out=${OUT:-results/gpu_long}
mkdir -p "$out"
left() { echo $(( limit - ($(date +%s) - start) )); }
fail() { echo "error: $*" | tee -a "$out/summary.txt" >&2; exit 1; }

(( $(left) > 330 )) || fail "LIMIT_S=$limit leaves $(left) s: too little for the warm start (~200 s) and a run"
[[ ${KEEP_WARM:-0} == 1 ]] || rm -rf results/.cache/medium-worked-*  # the wall then includes the warm start
rc=0
timeout -k 10 "$(( $(left) - 150 ))" python3 scripts/gpu_learn.py warm "$config" 2>&1 | tee "$out/warm.txt" \
  || rc=$?
(( rc == 0 )) || fail "the warm start failed or ran out of time (rc $rc): see $out/warm.txt"

# fit's own clock (trainer.max_time) starts after its start-up (the 312M policy, the engine, the dataset: 60 s
# are kept for it and the teardown); SIGINT at the hard deadline makes it finish its step and stop, SIGKILL 20 s later
train=$(( $(left) - 60 ))
(( train >= 60 )) || fail "only $(left) s left after the warm start, too little to train"
fit_one() {  # name, variant: one fit and its summary; returns non-zero, saying why, when it failed
  local name=$1 run=$out/$1 rc=0 summary_rc=0 fit_start
  local -a variant args
  read -ra variant <<< "$2"
  args=(fit --config "$config" --trainer.max_time="$(printf '00:00:%02d:%02d' $(( train / 60 )) $(( train % 60 )))"
        --trainer.default_root_dir="$run" --trainer.enable_progress_bar=false
        --trainer.logger.class_path=lightning.pytorch.loggers.CSVLogger --trainer.logger.init_args.save_dir="$run"
        --trainer.logger.init_args.flush_logs_every_n_steps=1 "${extra[@]}" "${variant[@]}")
  fit_start=$(date +%s)
  timeout -s INT -k 20 "$(( $(left) - 15 ))" python3 -m sc_lightning "${args[@]}" > "$out/$name-fit.log" 2>&1 || rc=$?
  cp "$run"/lightning_logs/version_0/metrics.csv "$out/$name-metrics.csv" 2>/dev/null || true
  { echo "$name (${2:-as shipped})"
    python3 scripts/gpu_learn.py summary "$out/$name-metrics.csv" --wall "$(( $(date +%s) - start ))" 2>&1 \
      || summary_rc=$?
    echo "$(grep '^warm start' "$out/warm.txt" | tail -1); fit: rc $rc after $(( $(date +%s) - fit_start )) s"
  } > "$out/$name-summary.txt"
  local why=""
  (( summary_rc == 0 )) || why="too few steps were logged to compare"
  (( rc == 0 )) || why="fit exited with rc $rc: see $out/$name-fit.log"
  [[ -z $why ]] && return 0
  { tail -20 "$out/$name-fit.log"; echo "error: $name: $why"; } >> "$out/$name-summary.txt"
  return 1
}
variants=("$@")
[[ ${#variants[@]} -gt 0 ]] || variants=("")
pids=()
for i in "${!variants[@]}"; do fit_one "run-$((i + 1))" "${variants[$i]}" & pids+=($!); done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
cat "$out"/run-*-summary.txt | tee "$out/summary.txt"
(( failed == 0 )) || fail "a run failed: see its summary above"
