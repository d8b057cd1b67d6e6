#!/usr/bin/env bash
# On the GPU machine: issue 37's long-answer example, timed as one device call. Installs what the image lacks
# (scripts/gpu_env.sh), builds the 312M warm start afresh (printing its time; KEEP_WARM=1 reuses a cached one), then
# runs `fit` on configs/grpo_1gpu_long.yaml in what is left of LIMIT_S (default 540 s, the whole script's wall),
# and writes into $OUT (or ./results/gpu_long): warm.txt, fit.log, metrics.csv and summary.txt, whose first line is
# "first5 X last5 Y climb Z steps N wall S" (S: seconds since the script started). Every step has a deadline: a
# stuck warm start or fit is killed, and the script then exits non-zero, saying which.
#   scripts/gpu_long.sh
#   FIT_ARGS="--policy.optimizer.lr 1e-5" LIMIT_S=580 scripts/gpu_long.sh
#   CONFIG=configs/grpo_1gpu.yaml scripts/gpu_long.sh             # another config, timed the same way
set -euo pipefail
start=$(date +%s)
limit=${LIMIT_S:-540}
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
run=$out/run
args=(fit --config "$config" --trainer.max_time="$(printf '00:00:%02d:%02d' $(( train / 60 )) $(( train % 60 )))"
      --trainer.default_root_dir="$run" --trainer.enable_progress_bar=false
      --trainer.logger.class_path=lightning.pytorch.loggers.CSVLogger --trainer.logger.init_args.save_dir="$run"
      --trainer.logger.init_args.flush_logs_every_n_steps=1 "${extra[@]}")
fit_start=$(date +%s)
rc=0
timeout -s INT -k 20 "$(( $(left) - 15 ))" python3 -m sc_lightning "${args[@]}" > "$out/fit.log" 2>&1 || rc=$?
cp "$run"/lightning_logs/version_0/metrics.csv "$out/metrics.csv" 2>/dev/null || true
summary_rc=0
python3 scripts/gpu_learn.py summary "$out/metrics.csv" --wall "$(( $(date +%s) - start ))" 2>&1 \
  | tee "$out/summary.txt" || summary_rc=$?
echo "$(grep '^warm start' "$out/warm.txt" | tail -1); fit: rc $rc after $(( $(date +%s) - fit_start )) s" \
  | tee -a "$out/summary.txt"
(( rc == 0 )) || { tail -20 "$out/fit.log" >&2; fail "fit exited with rc $rc: see $out/fit.log"; }
(( summary_rc == 0 )) || fail "too few steps were logged to compare: see $out/fit.log"
