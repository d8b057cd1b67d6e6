"""The VLM at TP=2 over two gloo processes equals TP=1: logprobs with images, the vision tower's gradient, and the
whole weights a refit exports (random init does not depend on TP)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sc_lightning.models.spec import builtin_spec
from tests.helpers.vlm import image_prompt, random_images
from tests.ranks import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("model_parallel")]
SPEC = builtin_spec("builtin:tiny-vlm")


def batch() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Two rows of an image each (at different places) and their images."""
    ids = torch.tensor([image_prompt(SPEC, [2], 0, [4, 13, 5, 16, 7]), image_prompt(SPEC, [2, 3], 0, [9, 4, 7, 8])])
    images = random_images(SPEC, 2, seed=5)
    return ids, [images[:1], images[1:]]


def results(tp: int) -> dict[str, object]:
    """Logprobs, the conv1 gradient of their sum and the exported weights of the seed-0 VLM at ``tp``."""
    from sc_lightning.models.convert import export_hf_weights
    from sc_lightning.models.logprobs import logprobs_from_logits
    from sc_lightning.models.vlm import build_vlm, vlm_logits

    model = build_vlm(SPEC, seed=0, tensor_parallel_size=tp)
    ids, images = batch()
    logprobs = logprobs_from_logits(vlm_logits(model, ids, images), ids, vocab_size=SPEC.vocab_size)
    logprobs.sum().backward()
    return {
        "logprobs": logprobs.detach(),
        "conv1_grad": model.vision_model.conv1.weight.grad.clone(),
        "export": {name: t.clone() for name, t in export_hf_weights(model, SPEC)},
    }


def save_results(rank: int, world_size: int, out: Path) -> None:
    """One rank of the TP=2 run: its results in ``out/rank{rank}.pt``."""
    torch.save(results(world_size), out / f"rank{rank}.pt")


def test_tp2_equals_tp1(tmp_path: Path) -> None:
    run_ranks(save_results, 2, tmp_path)
    tp1 = results(1)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert (got["logprobs"] - tp1["logprobs"]).abs().max() < 1e-5
        assert torch.allclose(got["conv1_grad"], tp1["conv1_grad"], atol=1e-6)
        assert got["export"].keys() == tp1["export"].keys()
        assert all(torch.equal(got["export"][n], tp1["export"][n]) for n in tp1["export"])
