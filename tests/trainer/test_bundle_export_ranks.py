"""A bundle of two trainer ranks (TP=2, or PP=2) exports in one process: its ``sharded/`` policy, read whole by
megatron-core's ``dist_checkpointing``, becomes a Hugging Face directory whose weights are the ranks' own and whose
``transformers`` logits equal the project's forward of the bundle."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sc_lightning.checkpoint.bundle import SHARDED_DIR, TRAINER_FILE
from sc_lightning.models.convert import export_hf_weights, read_hf_safetensors
from sc_lightning.models.hf_export import PolicySource
from sc_lightning.models.policy_source import model_spec
from sc_lightning.trainer.bundle_policy import POLICY_SOURCE_KEY, export_bundle
from sc_lightning.trainer.sharded_checkpoint import shard_trainer_checkpoint
from tests.helpers.exports import assert_export_matches_bundle, assert_tokenizer_round_trips
from tests.helpers.hf_models import make_hf_model_dir
from tests.helpers.parallel import new_policy, train_steps
from tests.ranks import run_ranks


def _train_and_save(rank: int, world_size: int, layout: dict[str, int], model_dir: Path, out: Path) -> None:
    """One GRPO step of the source's architecture at ``layout``, then the bundle the strategy writes: every rank its
    shards in ``sharded/``, the leader ``trainer.ckpt`` recording the policy's source; this rank's HF tensors."""
    spec = model_spec(str(model_dir))
    model, optimizer = new_policy(spec=spec, **layout)
    train_steps(model, optimizer, range(1))
    checkpoint = {"state_dict": {}, POLICY_SOURCE_KEY: PolicySource(str(model_dir), None, "fp32", spec).to_dict()}
    shard_trainer_checkpoint(checkpoint, out / "bundle" / SHARDED_DIR, lambda _: {"policy": (model, None)})
    if rank == 0:
        torch.save(checkpoint, out / "bundle" / TRAINER_FILE)
    # a pipeline stage yields its own layers (and the tied embedding) under their model-wide names
    torch.save({name: t.clone() for name, t in export_hf_weights(model, spec)}, out / f"weights{rank}.pt")


@pytest.mark.slow  # ranks in processes
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("name", "layout"),
    [("qwen2.5", {"tensor_parallel_size": 2}), ("llama3", {"pipeline_parallel_size": 2})],
    ids=["tp2-qwen2.5", "pp2-llama3"],
)
def test_a_two_rank_bundle_exports_whole(tmp_path: Path, name: str, layout: dict[str, int], model_parallel) -> None:
    # two KV groups, which TP=2 splits; an odd vocabulary, which TP=2 pads by a row that the export drops
    model_dir = make_hf_model_dir(tmp_path / "source", name, num_key_value_heads=2, vocab_size=321)
    run_ranks(_train_and_save, 2, layout, model_dir, tmp_path)
    export = export_bundle(tmp_path / "bundle" / TRAINER_FILE, tmp_path / "export", max_shard_bytes=50_000)
    exported = read_hf_safetensors(export)
    exported.setdefault("lm_head.weight", exported["model.embed_tokens.weight"])  # tied: one table for both ends
    for rank in range(2):
        for tensor_name, tensor in torch.load(tmp_path / f"weights{rank}.pt").items():
            assert exported[tensor_name].equal(tensor), (rank, tensor_name)
    assert_export_matches_bundle(export, tmp_path / "bundle" / TRAINER_FILE, model_dir)
    assert_tokenizer_round_trips(export, model_dir, ["Add the numbers.", "3+4=7"])
