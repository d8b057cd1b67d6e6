#!/usr/bin/env bash
# On the GPU machine: install what its image lacks (scripts/gpu_env.sh), then run the GPU benchmarks at the issue-16
# shapes, each printing its ratio against its bound (figures go to benchmarks/README.md with date and machine):
#   train step   1.26B, 8 x 2048 tokens, bf16 with fp32 masters: MFU, sc_lightning's GRPO step next to the bare model
#                (then the kernels of one GRPO step), and again with megatron's unfused SwiGLU and RoPE
#   engine       1.26B, bf16: generated tokens/s at batch 1 / 16 / 64 and the fraction of the HBM-bandwidth bound,
#                on the default (fused) decode path and on the unfused one
#   decode attention  1.26B's groups, 128 / 256 rows: the split kernel against the unsplit one and a copy, on a
#                bf16 cache and an fp8 one
#   refit        142M (builtin:small), bf16, colocated: the device-to-device refit against one copy of the weights
set -uo pipefail  # one benchmark failing does not stop the others
source "$(dirname "$0")/gpu_env.sh"
cd benchmarks
python3 train_step.py --device cuda --precision bf16 --micro-batch 4 --reps 6 --profile
python3 train_step.py --device cuda --precision bf16 --micro-batch 4 --reps 6 --unfused
python3 engine.py --model 1.26b --device cuda --precision bf16 --reps 3
python3 engine.py --model 1.26b --device cuda --precision bf16 --reps 3 --unfused-decode
for dtype in bf16 fp8; do
  python3 decode_attention.py --shapes 1.26b --splits 512 --blocks 64 128 --kv-cache-dtype $dtype
done
python3 refit.py --sizes 142M --engines colocated --device cuda --precision bf16
