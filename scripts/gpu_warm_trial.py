"""Try a worked-arithmetic warm-start recipe on the GPU without caching it: how fast its expected reward climbs.

The long-answer example's warm start (``builtin:medium-worked``, sc_lightning/models/warm_worked.py) must bring the
reward of sampling to about 0.3 before RL can climb. This trains ``builtin:medium`` from scratch with the given
learning rate, optimizer-step size and token budget, and prints the warm start's progress lines (tokens, loss,
expected reward, seconds) as it goes, so a device call can compare recipes side by side under ``timeout``.

    python scripts/gpu_warm_trial.py --lr 1e-3 --batch-tokens 8192 --max-tokens 20000000
"""

from __future__ import annotations

import argparse
import logging

import torch

from sc_lightning.models import build_gpt_model
from sc_lightning.models.spec import builtin_spec
from sc_lightning.models.warm_worked import WorkedBudget, train_worked


def main() -> None:
    """Parse the recipe and train it, printing progress every ``--check-every`` steps."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--batch-tokens", type=int, default=WorkedBudget.batch_tokens)
    parser.add_argument("--max-tokens", type=int, default=WorkedBudget.max_tokens)
    parser.add_argument("--warmup-steps", type=int, default=WorkedBudget.warmup_steps)
    parser.add_argument("--check-every", type=int, default=20)
    parser.add_argument("--model", default="builtin:medium")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = builtin_spec(args.model)
    model = build_gpt_model(spec, precision="bf16" if device == "cuda" else "fp32", seed=0, device=device)
    budget = WorkedBudget(
        max_tokens=args.max_tokens, batch_tokens=args.batch_tokens, warmup_steps=args.warmup_steps, target_reward=0.9
    )
    print(f"recipe: lr {args.lr} batch_tokens {args.batch_tokens} warmup {args.warmup_steps} on {device}", flush=True)
    reward = train_worked(model, spec, lr=args.lr, seed=0, check_every=args.check_every, budget=budget)
    print(f"final expected reward {reward:.3f}")


if __name__ == "__main__":
    main()
