#!/usr/bin/env bash
# On the GPU machine: install what its image lacks (scripts/gpu_env.sh), warm-start the one-GPU example's policy
# once, then run `fit` on configs/grpo_1gpu.yaml once per learning rate given, side by side on the one GPU, and print
# each run's reward climb (first 5 vs last 5 steps) and wall time. Runs write under $OUT (or ./results/gpu_learn).
#   scripts/gpu_learn.sh                              # the shipped config alone
#   scripts/gpu_learn.sh 2e-5 5e-5 1.5e-4             # a learning-rate sweep
#   CONFIG=configs/ppo_1gpu.yaml scripts/gpu_learn.sh # the PPO twin
set -euo pipefail
source "$(dirname "$0")/gpu_env.sh"
config=${CONFIG:-configs/grpo_1gpu.yaml}
root=${OUT:-results/gpu_learn}
limit=${LIMIT_S:-600}  # seconds per run
read -ra extra <<< "${FIT_ARGS:-}"  # more fit arguments, e.g. FIT_ARGS="--grpo.max_num_steps 200"
python3 scripts/gpu_learn.py warm "$config"
mkdir -p "$root"
rates=("$@")
[[ ${#rates[@]} -gt 0 ]] || rates=(shipped)
for lr in "${rates[@]}"; do
  run="$root/lr-$lr"  # CSV metrics whatever the image has: with tensorboard installed Lightning would pick it
  args=(fit --config "$config" --trainer.default_root_dir="$run" --trainer.enable_progress_bar=false
        --trainer.logger.class_path=lightning.pytorch.loggers.CSVLogger --trainer.logger.init_args.save_dir="$run"
        "${extra[@]}")
  [[ $lr == shipped ]] || args+=(--policy.optimizer.lr "$lr" --policy.optimizer.min_lr "$lr")
  ( start=$(date +%s); rc=0; timeout "$limit" python3 -m sc_lightning "${args[@]}" > "$root/lr-$lr.log" 2>&1 || rc=$?
    echo "lr $lr: rc $rc after $(( $(date +%s) - start )) s" ) &
done
wait
python3 scripts/gpu_learn.py climb "$root"
for run in "$root"/lr-*/; do  # each run's metrics beside its log, where a shallow copy-back finds them
  cp "$run"lightning_logs/version_0/metrics.csv "${run%/}.csv" 2>/dev/null || true
done
