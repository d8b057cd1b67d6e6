"""A trainer bundle's policy, read back whole in one process, and exported as a Hugging Face directory.

Every trainer checkpoint records where its policy came from (:data:`POLICY_SOURCE_KEY`: the model name, tokenizer,
precision and architecture, a :class:`~sc_lightning.models.hf_export.PolicySource`). :func:`load_bundle_policy`
builds that policy unsharded (TP = PP = 1) in this process and fills it from the trainer checkpoint's model state,
or, for a bundle of several trainer ranks, from its ``sharded/`` distributed checkpoint: megatron-core's
``dist_checkpointing`` reads every TP shard and PP stage into the full layout, as a resume on another layout does.
:func:`export_bundle` then writes it with :func:`~sc_lightning.models.hf_export.write_hf_export`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sc_lightning.config.model import PolicyConfig
from sc_lightning.models.convert import export_hf_weights, hf_param_shapes, unwrapped_name
from sc_lightning.models.hf_export import (
    DEFAULT_MAX_SHARD_BYTES,
    ExportError,
    PolicySource,
    check_exportable,
    check_output_dir,
    write_hf_export,
)
from sc_lightning.models.spec import ModelSpec
from sc_lightning.trainer.sharded_checkpoint import load_sharded, sharded_directory

POLICY_SOURCE_KEY = "sc_lightning_policy"
"""The trainer checkpoint's entry recording its policy's :class:`PolicySource` (as plain data)."""
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_EMBEDDING = "policy.embedding.word_embeddings.weight"


def policy_source_for(policy: PolicyConfig, model_name: str, spec: ModelSpec) -> PolicySource:
    """The source of a ``spec`` policy built from ``model_name`` (``policy.model_name``, a warm start resolved to its
    directory) under ``policy``'s knobs; local directories are recorded as absolute paths."""
    tokenizer = policy.tokenizer_name and _absolute(policy.tokenizer_name)
    return PolicySource(_absolute(model_name), tokenizer, policy.precision, spec)


def _absolute(name: str) -> str:
    """``name`` as an absolute path when it names a local directory; else unchanged (``builtin:*``, an HF id)."""
    path = Path(name).expanduser()
    return str(path.resolve()) if not name.startswith("builtin:") and path.is_dir() else name


def policy_source_of(checkpoint: dict[str, Any], path: Path, fallback: PolicySource | None) -> PolicySource:
    """The policy source the trainer checkpoint at ``path`` (holding ``checkpoint``) records, else ``fallback``."""
    if POLICY_SOURCE_KEY in checkpoint:
        return PolicySource.from_dict(checkpoint[POLICY_SOURCE_KEY])
    if fallback is not None:
        return fallback
    raise ExportError(
        f"{path} does not record which model its policy is (a bundle written before exports existed): give the "
        "run's config with --config, so policy.model_name, policy.tokenizer_name and policy.precision say it"
    )


def load_bundle_policy(
    trainer_checkpoint: Path, fallback: PolicySource | None = None
) -> tuple[torch.nn.Module, PolicySource]:
    """The policy of the trainer checkpoint at ``trainer_checkpoint``, unsharded (TP = PP = 1) on the CPU, and its
    source (``fallback`` when the checkpoint records none). Initialises megatron's parallel state at TP = PP = 1.

    A sharded policy keeps the embedding rows it was saved with (its vocabulary padded for the saving run's TP size):
    read its first ``source.spec.vocab_size`` logits, as :func:`export_bundle` keeps that many rows."""
    from sc_lightning.models.megatron import build_gpt_model, load_megatron_state

    checkpoint = torch.load(trainer_checkpoint, map_location="cpu", weights_only=False, mmap=True)
    source = policy_source_of(checkpoint, trainer_checkpoint, fallback)
    check_exportable(source)  # a vision-language policy: before its model is built as a text one
    directory = sharded_directory(checkpoint, trainer_checkpoint)
    # the vocabulary as saved: padded to a multiple of the saving run's TP size (an export drops the padding rows)
    spec = source.spec.replace(vocab_size=_saved_vocab_rows(directory)) if directory else source.spec
    dtype = _DTYPES[source.precision]
    placeholder = {  # every weight comes from the checkpoint: allocate, do not initialise
        name: torch.empty(shape, dtype=dtype)
        for name, shape in hf_param_shapes(spec).items()
        if not (spec.tie_word_embeddings and name == "lm_head.weight")
    }
    model = build_gpt_model(spec, precision=source.precision, hf_state=placeholder, device="cpu")
    if directory is not None:
        load_sharded(directory, {"policy": (model, None)})
    else:
        state = {
            unwrapped_name(key.removeprefix("policy.")): value
            for key, value in checkpoint["state_dict"].items()
            if key.startswith("policy.")
        }
        load_megatron_state(model, state)
    return model.eval(), source


def _saved_vocab_rows(directory: Path) -> int:
    """The embedding rows of the policy in the distributed checkpoint ``directory`` (its vocabulary, padded)."""
    from megatron.core import dist_checkpointing

    return int(dist_checkpointing.load_tensors_metadata(str(directory))[_EMBEDDING].global_shape[0])


def export_bundle(
    trainer_checkpoint: Path,
    output: Path,
    *,
    fallback: PolicySource | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: bool = False,
) -> Path:
    """Write the policy of the trainer checkpoint at ``trainer_checkpoint`` as a Hugging Face directory at ``output``
    (see :mod:`~sc_lightning.models.hf_export`); returns ``output``."""
    check_output_dir(output)  # before the policy is loaded
    model, source = load_bundle_policy(trainer_checkpoint, fallback)
    with torch.no_grad():
        weights = export_hf_weights(model, source.spec)
        return write_hf_export(output, source, weights, max_shard_bytes=max_shard_bytes, progress=progress)
