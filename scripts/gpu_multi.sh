#!/usr/bin/env bash
# On a machine with several GPUs (issue 41), in one device call: install what the image lacks (scripts/gpu_env.sh;
# bring Ray with SC_GPU_RAY=1 scripts/gpu_wheels.sh for the refit), then at the 1.26B shape, bf16:
#   1. the training step on one GPU, at TP = 2 on two (its first step's loss and gradient norm beside one GPU's: the
#      same rows, split layers), and data-parallel on every GPU (each replica its own rows: the scaling efficiency
#      is one GPU's step time over N's) — benchmarks/train_step.py under torchrun;
#   2. the split-placement refit: the engine actor on the last GPU, the trainer's weights broadcast to it over NCCL,
#      against one GPU-to-GPU copy of the same bytes (benchmarks/refit.py --engines broadcast; needs Ray).
#   3. (MULTI_PARTS=split, a call of its own) split placement end to end at the 1.26B shape: the engine actor on the
#      last GPU, the trainer on the first, on-policy (actor-sync) and with one step of lookahead (async), 3 steps each
#      without the parts' benchmarks (benchmarks/e2e.py; needs Ray).
#   4. (MULTI_PARTS=kill) the fault drill on two GPUs: configs/grpo_1gpu.yaml at DP = 2 over NCCL (its warm start
#      built first), rank 1 SIGKILLed after two bundles, the run must end naming it and the same command resume with
#      every prompt trained once (scripts/kill_drill.py; needs Ray: two ranks read TransferQueue).
#   5. (MULTI_PARTS=fleet, a call of its own, 4 or 8 GPUs) the 1B recipe's shape end to end: the llama1b shape
#      (512 completions a step, long-tailed answers), async with one step of lookahead, half the GPUs training
#      data-parallel and an engine replica on each of the others, FLEET_STEPS (50) steps; tokens/s/GPU over all
#      of them, MFU and the split (benchmarks/e2e.py --trainer-devices --engine-gpus; needs Ray).
# Each part has a deadline and prints its table; the outputs go to $OUT (train-*.txt, refit.txt, e2e-*.txt,
# kill.txt, e2e-fleet.txt).
#   OUT=/tmp/multi scripts/gpu_multi.sh
#   MULTI_PARTS=train OUT=/tmp/multi scripts/gpu_multi.sh     # the training step only (no Ray needed)
#   MULTI_PARTS=split OUT=/tmp/multi scripts/gpu_multi.sh     # async vs sync with the engine on its own GPU
#   MULTI_PARTS=kill OUT=/tmp/multi scripts/gpu_multi.sh      # kill -9 of one of two ranks, and the resume
#   MULTI_PARTS=fleet OUT=/tmp/multi scripts/gpu_multi.sh     # N/2 trainer ranks, N/2 engine replicas, 50 steps
set -uo pipefail  # one part failing does not stop the others
out=${OUT:?set OUT to the folder the results go to}
mkdir -p "$out"
source "$(dirname "$0")/gpu_env.sh"
gpus=$(nvidia-smi --list-gpus | wc -l)
parts=${MULTI_PARTS:-train refit}
step=(benchmarks/train_step.py --device cuda --precision bf16 --reps 5)
torchrun=(python3 -m torch.distributed.run --standalone)
show() { grep -v -i warn "$1" | grep -E "parameters|first GRPO|^\||GRPO step /|^size|^1.26B|measured|Error|error" ; }
if [[ " $parts " == *" train "* ]]; then
  timeout -k 10 150 python3 "${step[@]}" > "$out/train-1gpu.txt" 2>&1; echo "rc $?" >> "$out/train-1gpu.txt"
  timeout -k 10 150 "${torchrun[@]}" --nproc-per-node 2 "${step[@]}" --tp 2 > "$out/train-tp2.txt" 2>&1
  echo "rc $?" >> "$out/train-tp2.txt"
  timeout -k 10 150 "${torchrun[@]}" --nproc-per-node "$gpus" "${step[@]}" > "$out/train-dp$gpus.txt" 2>&1
  echo "rc $?" >> "$out/train-dp$gpus.txt"
  for f in "$out"/train-*.txt; do echo "== $(basename "$f")"; show "$f"; tail -1 "$f"; done
fi
if [[ " $parts " == *" refit "* ]]; then
  timeout -k 10 240 python3 benchmarks/refit.py --sizes 1.26B --engines broadcast --device cuda --precision bf16 \
    --reps 3 > "$out/refit.txt" 2>&1
  echo "rc $?" >> "$out/refit.txt"
  echo "== refit.txt"; show "$out/refit.txt"; tail -1 "$out/refit.txt"
fi
if [[ " $parts " == *" split "* ]]; then
  for mode in actor-sync async; do
    timeout -k 10 270 python3 benchmarks/e2e.py --shape 1.26b --mode "$mode" --steps 3 --no-parts \
      --out "/tmp/sc_e2e_$mode" --fit-timeout 250 > "$out/e2e-$mode.txt" 2>&1
    echo "rc $?" >> "$out/e2e-$mode.txt"
    echo "== e2e-$mode.txt"; grep -v -i warn "$out/e2e-$mode.txt" | tail -12
  done
fi
if [[ " $parts " == *" kill "* ]]; then
  rm -rf /tmp/sc_kill_drill  # the drill wants an empty run directory
  timeout -k 10 200 python3 scripts/gpu_learn.py warm configs/grpo_1gpu.yaml > "$out/kill.txt" 2>&1
  timeout -k 10 420 python3 scripts/kill_drill.py --dir /tmp/sc_kill_drill --save-period 4 --timeout-s 200 -- \
    --config configs/grpo_1gpu.yaml --trainer.devices 2 --data_plane.backend simple --grpo.max_num_epochs 1 \
    --grpo.max_num_steps 24 >> "$out/kill.txt" 2>&1
  echo "rc $?" >> "$out/kill.txt"
  echo "== kill.txt"; grep -E "^(warm start|killed|the run|it named|the same|trained|every|PASSED|FAILED)|^rc " "$out/kill.txt"
fi
if [[ " $parts " == *" fleet "* ]]; then
  half=$((gpus / 2))
  timeout -k 10 560 python3 benchmarks/e2e.py --shape llama1b --mode async --trainer-devices "$half" \
    --engine-gpus "$half" --steps "${FLEET_STEPS:-50}" --no-parts --out /tmp/sc_e2e_fleet --fit-timeout 540 \
    > "$out/e2e-fleet.txt" 2>&1
  echo "rc $?" >> "$out/e2e-fleet.txt"
  echo "== e2e-fleet.txt"; grep -v -i warn "$out/e2e-fleet.txt" | tail -14
fi
