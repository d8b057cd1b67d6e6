"""One rank of the TP=2 check: :func:`save_rank_results` under ``tests.ranks.run_ranks`` (gloo), or
``python -m tests.models.tp_worker RANK WORLD PORT OUT_DIR NAME=PATH...`` (``gpu_smoke.py``, NCCL).

Builds each model at TP=WORLD over gloo (over NCCL on the GPUs with ``TP_DEVICE=cuda``), and saves what the
parent test compares with TP=1: gathered logits, token log-probs, the final-norm gradient of
``sum(token_logprobs)``, this rank's megatron shard and the HF-named export. Also exports ``builtin:tiny``
(seed 0) to check that random init does not depend on TP.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore")


def _run_model(path: str, tp: int) -> dict[str, object]:
    """Everything the parent compares for one model directory (or builtin name)."""
    from sc_lightning.models.convert import export_hf_weights
    from sc_lightning.models.logprobs import logits_of, token_logprobs
    from sc_lightning.models.megatron import load_policy
    from tests.helpers.models import random_ids

    device = os.environ.get("TP_DEVICE", "cpu")
    model, spec, _ = load_policy(path, precision="fp32", seed=0, tp=tp, device=device)
    ids = random_ids(3, 24, seed=11, vocab=spec.vocab_size).to(device)
    with torch.no_grad():
        logits = logits_of(model, ids)
    logprobs = token_logprobs(model, ids)
    logprobs.sum().backward()
    shard = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
    return {
        "logits": logits,
        "logprobs": logprobs.detach(),
        "norm_grad": model.decoder.final_layernorm.weight.grad.clone(),
        "shard": shard,
        "export": {name: t.clone() for name, t in export_hf_weights(model, spec)},
    }


def save_rank_results(rank: int, world: int, out_dir: Path, models: list[str]) -> None:
    """Run every ``NAME=PATH`` model at TP=``world`` on this rank; save the results to ``OUT_DIR/rank{RANK}.pt``."""
    from sc_lightning.models.megatron import init_model_parallel

    init_model_parallel(world, device=os.environ.get("TP_DEVICE", "cpu"))
    results = {}
    for item in models:
        name, path = item.split("=", 1)
        results[name] = _run_model(path, world)
    torch.save(results, out_dir / f"rank{rank}.pt")


def main(argv: list[str]) -> None:
    """One rank started from the command line (``tests/models/gpu_smoke.py`` on two GPUs)."""
    rank, world, port, out_dir = int(argv[0]), int(argv[1]), argv[2], Path(argv[3])
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port
    )
    torch.set_num_threads(1)
    save_rank_results(rank, world, out_dir, argv[4:])
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
