"""The trainer's models and optimizers as a distributed checkpoint: megatron-core's ``dist_checkpointing``.

Every rank writes its own shards in parallel (the ``torch_dist`` format); each tensor is saved with its place in
the global tensor (megatron's ``sharded_state_dict``), so a load on another tensor- or data-parallel layout
reshards: a rank reads exactly the slices it now holds. AdamW's moments are sharded like their parameters (megatron's
``optim_state_to_sharding_state``; megatron's distributed optimizer gathers its data-parallel slices into the same
per-parameter form, with its main weights); the hyper-parameters, step counts and each optimizer's form are plain
common state. A load needs the form this run's optimizers keep: another fails naming the knob that sets it.

    parts = {"policy": (policy, policy_optimizer), "reference": (reference, None), ...}
    save_sharded(directory, parts)        # a collective: every rank calls it with its own shards
    load_sharded(directory, parts)        # the same parts, built for the new layout: loaded in place

A trainer checkpoint (Lightning's ``trainer.ckpt``) whose models went to such a directory beside it keeps only a note
of where (:data:`SHARDED_KEY`, written by :func:`shard_trainer_checkpoint`; :func:`sharded_directory` reads it back).

megatron's ``torch_dist`` writer hands its write results through a queue it creates on first use in a
``multiprocessing.Manager`` server process (made for asynchronous saves, which run elsewhere). That server outlives a
rank killed by a signal (Lightning's launcher SIGKILLs the leader when another rank dies), holding on to the rank's
memory and its inherited stdout/stderr, so a pipe reading the run's output never closes. Our saves are synchronous:
the queue is written and read in the saving process, so an in-process queue serves it and no server is started.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from megatron.core import dist_checkpointing
from megatron.core.dist_checkpointing.optimizer import (
    get_param_id_to_sharded_param_map,
    optim_state_to_sharding_state,
)
from megatron.core.dist_checkpointing.strategies import filesystem_async

from sc_lightning.models.cpu_compat import cuda_calls_on

Part = tuple[torch.nn.Module, torch.optim.Optimizer | None]
"""A model and its optimizer (None: the model is not trained, e.g. the frozen reference)."""
SHARDED_KEY = "sc_lightning_sharded"
"""The trainer checkpoint's entry saying its models and optimizers are in a distributed checkpoint beside it."""

_MOMENTS = ("exp_avg", "exp_avg_sq")


def _optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    """The optimizer's parameters in its state-dict order."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _sharded_optimizer_state(
    optimizer: torch.optim.Optimizer, model_state: dict[str, Any], *, template: bool
) -> dict[str, Any]:
    """The optimizer's state with each moment sharded like its parameter; ``template``: zero moments in the shape
    a load fills (a fresh optimizer has no state yet). An optimizer with its own ``sharded_state_dict`` (megatron's
    mixed-precision stack) describes itself."""
    if hasattr(optimizer, "sharded_state_dict"):
        return optimizer.sharded_state_dict(model_state, is_loading=template)
    params = _optimizer_params(optimizer)
    state = optimizer.state_dict()
    steps = [float(s["step"]) for s in state["state"].values() if "step" in s]
    if template:
        state["state"] = {i: {name: torch.zeros_like(p) for name in _MOMENTS} for i, p in enumerate(params)}
    else:
        state["state"] = {i: {n: v for n, v in s.items() if n != "step"} for i, s in state["state"].items()}
    optim_state_to_sharding_state(state, get_param_id_to_sharded_param_map(model_state, params))
    state["step"] = steps[0] if steps else 0.0  # AdamW steps every parameter together
    return state


def _sharded_state(parts: Mapping[str, Part], *, template: bool) -> dict[str, Any]:
    """The sharded state of every part: ``{name: {"model": ..., "optimizer": ...}}``."""
    state: dict[str, Any] = {}
    for name, (model, optimizer) in parts.items():
        model_state = model.sharded_state_dict(prefix=f"{name}.")
        state[name] = {"model": model_state}
        if optimizer is not None:
            state[name]["optimizer"] = _sharded_optimizer_state(optimizer, model_state, template=template)
            state[name]["optimizer_form"] = optimizer_form(optimizer)
    return state


def optimizer_form(optimizer: torch.optim.Optimizer) -> str:
    """The form an optimizer's checkpointed state takes: ``distributed`` (megatron's distributed optimizer: main
    weights and moments) or ``per-parameter`` (moments, and fp32 masters for bf16)."""
    return "distributed" if getattr(optimizer, "distributed", False) else "per-parameter"


_FORMS = {"distributed": "megatron's distributed optimizer", "per-parameter": "a non-distributed optimizer"}


class CheckpointMismatch(ValueError):
    """A distributed checkpoint that does not fit this run's models or optimizers; the message names the fix."""


def _check_optimizer_forms(directory: Path, parts: Mapping[str, Part]) -> None:
    """Fail, naming the knob, when a part's optimizer keeps its state in another form than the one saved."""
    saved = dist_checkpointing.load_common_state_dict(str(directory))
    for name, (_, optimizer) in parts.items():
        if optimizer is None:
            continue
        was, now = saved.get(name, {}).get("optimizer_form", "per-parameter"), optimizer_form(optimizer)
        if was != now:
            raise CheckpointMismatch(
                f"{directory}: {name}'s optimizer state was saved by {_FORMS[was]}, but this run uses {_FORMS[now]}: "
                f"resume with megatron_cfg.use_distributed_optimizer (policy's, value's for the critic) set to "
                f"{str(was == 'distributed').lower()}, as in the run that saved it"
            )


def saved_part_names(directory: Path) -> set[str]:
    """The names of the parts whose models ``directory`` holds (``policy``, ``critic``, ...)."""
    return {key.split(".", 1)[0] for key in dist_checkpointing.load_tensors_metadata(str(directory))}


def _device(parts: Mapping[str, Part]) -> torch.device:
    model = next(iter(parts.values()))[0]
    return next(model.parameters()).device


def save_sharded(directory: Path, parts: Mapping[str, Part]) -> None:
    """Write every part's shards into ``directory`` (created; every rank calls this, each writing its shards)."""
    directory.mkdir(parents=True, exist_ok=True)
    if filesystem_async._results_queue is None:  # see the module docstring: no Manager process for a sync save
        filesystem_async._results_queue = queue.Queue()
    with cuda_calls_on(_device(parts)):
        dist_checkpointing.save(_sharded_state(parts, template=False), str(directory))


def load_sharded(directory: Path, parts: Mapping[str, Part]) -> None:
    """Load ``directory`` into ``parts`` (built for this run's layout), resharding as needed; every rank calls it."""
    _check_optimizer_forms(directory, parts)
    with cuda_calls_on(_device(parts)):
        loaded = dist_checkpointing.load(_sharded_state(parts, template=True), str(directory))
    for name, (model, optimizer) in parts.items():
        weights = {key.removeprefix(f"{name}."): value for key, value in loaded[name]["model"].items()}
        result = model.load_state_dict(weights, strict=False)
        missing = [key for key in result.missing_keys if not key.endswith("_extra_state")]
        if missing or result.unexpected_keys:
            raise CheckpointMismatch(
                f"{directory}: {name} does not fit: missing {missing[:4]}, unexpected {result.unexpected_keys[:4]}"
            )
        if optimizer is not None:
            _load_optimizer(optimizer, loaded[name]["optimizer"])


def shard_trainer_checkpoint(
    checkpoint: dict[str, Any], directory: Path, parts: Callable[[bool], Mapping[str, Part]]
) -> None:
    """Save a trainer checkpoint's models — and its optimizers, when it holds their states — to ``directory`` as a
    distributed checkpoint (a collective: every rank writes its shards), leaving in ``checkpoint`` only a note of
    where. ``parts(with_optimizers)``: the models by name, each with its optimizer when asked for."""
    with_optimizers = "optimizer_states" in checkpoint
    save_sharded(directory, parts(with_optimizers))
    checkpoint["state_dict"] = {}  # Lightning checks the keys exist; the models load from the directory
    if with_optimizers:
        checkpoint["optimizer_states"] = []
    checkpoint[SHARDED_KEY] = {"directory": directory.name, "optimizers": with_optimizers}


def sharded_directory(checkpoint: Mapping[str, Any], path: str | Path) -> Path | None:
    """The distributed checkpoint beside the trainer checkpoint at ``path`` that holds its models (``checkpoint``
    is what ``path`` holds), or None when the models are in the trainer checkpoint itself."""
    if SHARDED_KEY not in checkpoint:
        return None
    return Path(path).parent / checkpoint[SHARDED_KEY]["directory"]


def trainer_checkpoint_mismatch(path: str | Path | None, what: str, err: Exception) -> CheckpointMismatch:
    """The error for a trainer checkpoint whose ``what`` (models, optimizers) do not fit this run's, with torch's
    reasons (3 at most) from ``err``."""
    details = [line.strip()[:160] for line in str(err).splitlines()[1:] if line.strip()]  # torch: one per kind
    reason = "; ".join(details[:3]) or str(err)
    return CheckpointMismatch(
        f"{path}: its {what} do not fit this run's ({reason}): resume with the model and optimizer settings of the "
        "run that wrote it (policy.model_name, policy.megatron_cfg, value.*), or start afresh with a new "
        "checkpointing.checkpoint_dir (nothing was deleted)"
    )


def _load_optimizer(optimizer: torch.optim.Optimizer, loaded: dict[str, Any]) -> None:
    """Restore AdamW from its loaded sharded state (moments as this rank's slices, the step count shared)."""
    if hasattr(optimizer, "load_sharded_state_dict"):
        optimizer.load_sharded_state_dict(loaded)
        return
    params = _optimizer_params(optimizer)
    step = loaded["step"]
    state = (
        {
            i: {**{n: loaded["state"][i][n] for n in _MOMENTS}, "step": torch.tensor(step, dtype=torch.float32)}
            for i in range(len(params))
        }
        if step
        else {}
    )
    groups = [
        {**group, "params": own["params"]}
        for group, own in zip(loaded["param_groups"], optimizer.state_dict()["param_groups"], strict=True)
    ]
    optimizer.load_state_dict({"state": state, "param_groups": groups})
