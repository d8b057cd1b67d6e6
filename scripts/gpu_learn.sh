#!/usr/bin/env bash
# On the GPU machine: install what its image lacks (scripts/gpu_env.sh), warm-start the one-GPU example's policy
# once, then run `fit` on configs/grpo_1gpu.yaml once per variant given (each a string of extra fit arguments), side
# by side on the one GPU, and print each run's reward climb (first 5 vs last 5 steps) and wall time. Runs write under
# $OUT (or ./results/gpu_learn) as run-1, run-2, ...
#   scripts/gpu_learn.sh                                                  # the shipped config alone
#   scripts/gpu_learn.sh "--policy.optimizer.lr 2e-5" "--policy.optimizer.lr 5e-5"   # a sweep
#   CONFIG=configs/ppo_1gpu.yaml scripts/gpu_learn.sh                     # the PPO twin
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
config=${CONFIG:-configs/grpo_1gpu.yaml}
root=${OUT:-results/gpu_learn}
limit=${LIMIT_S:-600}  # seconds per run
read -ra extra <<< "${FIT_ARGS:-}"  # more fit arguments, e.g. FIT_ARGS="--grpo.max_num_steps 200"
python3 scripts/gpu_learn.py warm "$config"
mkdir -p "$root"
variants=("$@")
[[ ${#variants[@]} -gt 0 ]] || variants=("")
for i in "${!variants[@]}"; do
  name="run-$((i + 1))"
  run="$root/$name"  # CSV metrics whatever the image has: with tensorboard installed Lightning would pick it
  read -ra variant <<< "${variants[$i]}"
  args=(fit --config "$config" --trainer.default_root_dir="$run" --trainer.enable_progress_bar=false
        --trainer.logger.class_path=lightning.pytorch.loggers.CSVLogger --trainer.logger.init_args.save_dir="$run"
        "${extra[@]}" "${variant[@]}")
  ( start=$(date +%s); rc=0; timeout "$limit" python3 -m sc_lightning "${args[@]}" > "$root/$name.log" 2>&1 || rc=$?
    echo "$name (${variants[$i]:-as shipped}): rc $rc after $(( $(date +%s) - start )) s"
    # the metrics beside the log as soon as the run ends, where a shallow copy-back finds them
    cp "$run"/lightning_logs/version_0/metrics.csv "$run.csv" 2>/dev/null || true
    # a failed run's reason in the printout itself: a device call may bring back too few files to include its log
    if (( rc != 0 )); then grep -v -i warn "$root/$name.log" | tail -15 | sed "s/^/$name| /" || true; fi ) &
done
wait
python3 scripts/gpu_learn.py climb "$root"
