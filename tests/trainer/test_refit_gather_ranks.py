"""The refit's weight stream in real processes (gloo on the CPU): at TP=2, PP=2, TP=2 x PP=2 and PP=2 x DP=2 the
leader's buckets, concatenated, are the whole policy exactly, and the leader never holds more than one bucket."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from sc_lightning.models import build_gpt_model, random_hf_state
from sc_lightning.models.convert import hf_param_shapes
from sc_lightning.trainer.rank_sync import RankGroup
from sc_lightning.trainer.refit_gather import bucket_units, policy_units
from tests.helpers.held_bytes import HeldBytes
from tests.helpers.train_rows import SPEC
from tests.ranks import run_ranks

pytestmark = pytest.mark.slow
BOUND = 40_000  # bytes: the tiny policy (340 kB; q/k/v 50 kB and gate/up 64 kB per layer) takes a dozen buckets


class FakeRecordingEngine:
    """FAKE engine side of a refit: keeps a copy of every tensor pushed (to compare) and each bucket's size, and
    asks the leader's counter how many gathered bytes were alive at each push."""

    def __init__(self, held: HeldBytes) -> None:
        self.held = held
        self.tensors: list[tuple[str, torch.Tensor]] = []
        self.buckets: list[tuple[int, list[str], bool]] = []  # (bytes, names, last)

    def push(self, bucket: list[tuple[str, torch.Tensor]], last: bool) -> None:
        self.tensors += [(name, tensor.clone()) for name, tensor in bucket]  # copies: not the stream's memory
        self.buckets.append((sum(t.numel() * t.element_size() for _, t in bucket), [n for n, _ in bucket], last))


def _stream_rank(rank: int, world_size: int, out: Path, tp: int, pp: int, tied: bool) -> None:
    """Build the seeded policy at this layout and stream it twice (two refits), the leader recording each."""
    spec = dataclasses.replace(SPEC, tie_word_embeddings=tied)
    model = build_gpt_model(spec, seed=0, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    ranks = RankGroup(timeout_s=120.0)
    for refit in range(2):
        held = HeldBytes()
        engine = FakeRecordingEngine(held)
        units = ((size, held.watch(gather)) for size, gather in policy_units(model, spec, ranks))
        for bucket, last in bucket_units(units, BOUND):
            engine.push(bucket, last)
            del bucket  # dropped before the next bucket is gathered, as the rollout side does
        # the next step's select: ranks that had nothing to send (another replica) got here long ago
        assert ranks.broadcast(f"after refit {refit}") == f"after refit {refit}"
        if ranks.leader:
            torch.save((engine.tensors, engine.buckets, held.peak), out / f"refit{refit}.pt")
        elif rank:
            assert not engine.tensors  # only the leader receives


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("world_size", "tp", "pp", "tied"),
    [(2, 2, 1, True), (2, 1, 2, False), (4, 2, 2, False), (4, 1, 2, False)],
    ids=["tp2-tied", "pp2", "tp2xpp2", "pp2xdp2"],  # (tied embeddings across stages need CUDA in megatron)
)
def test_the_streamed_buckets_are_the_whole_policy_and_the_leader_holds_one_at_most(
    tmp_path: Path, world_size: int, tp: int, pp: int, tied: bool
) -> None:
    run_ranks(_stream_rank, world_size, tmp_path, tp, pp, tied)
    spec = dataclasses.replace(SPEC, tie_word_embeddings=tied)
    whole = random_hf_state(spec, seed=0)  # what build_gpt_model loaded, whatever the layout
    if tied:
        whole["lm_head.weight"] = whole["model.embed_tokens.weight"]  # the export names both ends
    sizes = {name: math.prod(shape) * 4 for name, shape in hf_param_shapes(spec).items()}  # fp32
    largest_tensor, largest_unit = max(sizes.values()), 2 * sizes["model.layers.0.mlp.up_proj.weight"]  # gate + up
    for refit in range(2):
        tensors, buckets, peak = torch.load(tmp_path / f"refit{refit}.pt")
        names = [name for name, _ in tensors]
        assert len(names) == len(set(names)) and set(names) == set(whole)  # every name exactly once
        for name, tensor in tensors:
            assert torch.equal(tensor, whole[name]), name  # bit for bit
        assert [last for *_, last in buckets] == [False] * (len(buckets) - 1) + [True] and len(buckets) > 5
        over = [names for size, names, _ in buckets if size > BOUND]  # a layer's q/k/v, or its gate/up: alone
        assert over and all(len({(n.split(".")[2], "mlp" in n) for n in names}) == 1 for names in over)
        assert peak <= BOUND + largest_tensor  # the task's bound; and in fact one bucket or one module at most:
        assert peak <= max(BOUND, largest_unit)
