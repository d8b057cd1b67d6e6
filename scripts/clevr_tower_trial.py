"""Train the tiny VLM with a given vision tower supervised on the tiny CLEVR: does the tower learn a kind of question?

``builtin:tiny-vlm`` (docs/vlm.md) with its vision tower's layers, width and patch size replaced is trained from
seeded random weights with the CLEVR warm start's steps (``clevr_step`` in sc_lightning/models/warm_vlm.py: AdamW,
64 examples a step, cross-entropy on the answer digit and eos) on questions of ``--kinds`` in turn. Every
``--check-every`` steps it prints, for each kind on 256 held-out questions, the reward sampling would earn (the warm
start's measure, ``expected_clevr_reward``) and the greedy accuracy (how often the answer digit is the most likely
token; 0.5 is the relation kind's guess), with the seconds so far. It stops after ``--steps`` or ``--minutes``.

    python scripts/clevr_tower_trial.py --kinds count colour relation --layers 2 --hidden 64 --patch 8 --minutes 5
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from sc_lightning.models.spec import ModelSpec, builtin_spec
from sc_lightning.models.warm_vlm import clevr_examples, clevr_step, expected_clevr_reward
from sc_lightning.tasks import clevr

Examples = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def tower_spec(layers: int, hidden: int, heads: int, patch: int) -> ModelSpec:
    """``builtin:tiny-vlm`` with a vision tower of ``layers`` layers ``hidden`` wide (MLP twice that), ``heads``
    attention heads and ``patch``-pixel patches; the projector and the language model are its own."""
    spec = builtin_spec("builtin:tiny-vlm")
    assert spec.vision is not None
    vision = dataclasses.replace(
        spec.vision,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        ffn_hidden_size=2 * hidden,
        patch_size=patch,
    )
    return spec.replace(vision=vision)


def greedy_accuracy(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, scenes: torch.Tensor) -> float:
    """How often the answer digit (the first of ``mask``'s tokens) is the model's most likely next token."""
    from sc_lightning.models.vlm import vlm_logits

    with torch.no_grad():
        logits = vlm_logits(model, ids, list(scenes[:, None])).float().cpu()  # (B, T, V)
    digit = mask.int().argmax(-1)  # (B,) the answer digit's position
    rows = torch.arange(len(ids))
    return float((logits[rows, digit - 1].argmax(-1) == ids[rows, digit]).float().mean())


def report(model: torch.nn.Module, held_out: dict[str, Examples], step: int, seconds: float) -> None:
    """Print each kind's expected reward and greedy accuracy on its held-out questions."""
    model.eval()
    figures = [
        f"{kind} {expected_clevr_reward(model, *examples):.2f}/{greedy_accuracy(model, *examples):.2f}"
        for kind, examples in held_out.items()
    ]
    model.train()
    print(f"step {step:5d} {seconds:6.0f} s  reward/greedy: {'  '.join(figures)}", flush=True)


def main() -> None:
    """Parse the tower and the budget, train, and print the held-out figures as it goes."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", default=list(clevr.KINDS), choices=clevr.KINDS)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--patch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--check-every", type=int, default=100)
    parser.add_argument("--examples", type=int, default=8192, help="training questions drawn (then sampled)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = tower_spec(args.layers, args.hidden, args.heads, args.patch)
    from sc_lightning.models.vlm import build_vlm

    model = build_vlm(spec, precision="fp32", seed=args.seed, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    examples = clevr_examples(spec, args.examples, f"trial-{args.seed}", tuple(args.kinds))
    held_out = {kind: clevr_examples(spec, 256, f"trial-held-out-{args.seed}", (kind,)) for kind in args.kinds}
    print(f"tower: {spec.vision} on {device}, kinds {args.kinds}, lr {args.lr}", flush=True)
    start, step = time.monotonic(), 0
    report(model, held_out, step, 0.0)
    while step < args.steps and time.monotonic() - start < 60 * args.minutes:
        clevr_step(model, optimizer, examples, step, 64)
        step += 1
        if step % args.check_every == 0:
            report(model, held_out, step, time.monotonic() - start)
    if step % args.check_every:
        report(model, held_out, step, time.monotonic() - start)


if __name__ == "__main__":
    main()
