"""The policy's weights for a refit, in HF names, streamed to the leader in buckets of bounded size.

    every rank of data-parallel replica 0:  export_hf_units(its stage)        TP peers join each all-gather
    stage s > 0, its first TP rank:         each unit it owns ──► the leader  (gloo, point to point, in order)
    the leader (stage 0, first TP rank):    its own units, then stage 1's, ... ──► bucket_units(bound)
                                            ──► (bucket, last) to the caller, one at a time

A *unit* is the HF tensors of one megatron module (:func:`~sc_lightning.models.convert.export_hf_units`): it never
splits across buckets, so an engine that fuses q/k/v or gate/up loads each module at once. Each unit is announced
by its size before it is gathered (received: its header comes first), and a bucket it would overflow is handed out
first, so the leader holds at most one bucket (``bound`` bytes, or one unit larger than that) plus the parameter
being all-gathered; every other rank holds at most one unit. Every rank agrees on the order without talking: the
stages in order, each in its export order. A name two stages hold (tied embeddings: the first stage's table and the
last stage's copy) is sent by the last stage that holds it, as the whole-model gather did. Data-parallel replicas
other than the first take no part. A rank that stops (the leader's push failed, a peer died) leaves the others in a
send or receive that ends at the rank group's timeout.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from sc_lightning.trainer.data_parallel import data_parallel_rank
from sc_lightning.trainer.rank_sync import LEADER, RankGroup

Named = list[tuple[str, Tensor]]
Header = list[tuple[str, tuple[int, ...], torch.dtype]]
Announced = tuple[int, Callable[[], Named]]
"""A unit announced before it is gathered: its bytes, and the call that gathers (or receives) it."""


def header_bytes(header: Header) -> int:
    """The bytes of the tensors a unit's header describes."""
    return sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in header)


def bucket_units(units: Iterable[Announced], bound: int) -> Iterator[tuple[Named, bool]]:
    """Consecutive ``units`` packed into buckets of at most ``bound`` bytes, each with whether it is the last.

    A unit larger than ``bound`` is a bucket of its own. Greedy, in order, and by the announced size: a bucket is
    handed out *before* the unit that would overflow it is gathered, so (once the caller drops each bucket before
    asking for the next) at most ``max(bound, largest unit)`` bytes are held, plus the gather in progress.
    """
    bucket: Named = []
    size = 0
    for nbytes, gather in units:
        if bucket and size + nbytes > bound:
            yield bucket, False
            bucket, size = [], 0
        bucket.extend(gather())
        size += nbytes
    if bucket:
        yield bucket, True


def stage_owners(spec: Any, pp_size: int) -> dict[str, int]:
    """For each HF name, the pipeline stage that sends it at a refit: the last stage that holds it."""
    from sc_lightning.models.convert import parameter_mappings

    owners: dict[str, int] = {}
    for stage in range(pp_size):
        names = [name for m in parameter_mappings(spec, pp_rank=stage, pp_size=pp_size) for name in m.hf]
        if spec.tie_word_embeddings and "model.embed_tokens.weight" in names:
            names.append("lm_head.weight")  # a stage holding the table also exports it as the output layer
        owners.update(dict.fromkeys(names, stage))
    return owners


def policy_buckets(
    model: torch.nn.Module, spec: Any, ranks: RankGroup | None, *, bound: int
) -> Iterator[tuple[Named, bool]]:
    """The policy in HF names as ``(bucket, last)`` on the leader; a collective: every rank must exhaust it.

    The leader's tensors never share memory with the live parameters (they outlive the next optimizer step);
    received ones are on the CPU. On the other ranks it yields nothing: they take part in the gathers (and send
    their stage's units) as they iterate.
    """
    yield from bucket_units(policy_units(model, spec, ranks), bound)


def policy_units(model: torch.nn.Module, spec: Any, ranks: RankGroup | None) -> Iterator[Announced]:
    """The policy's units as announced to the leader (its own stage's, then each later stage's as received);
    nothing on the other ranks. A collective like :func:`policy_buckets`, which packs these (a test can watch each
    unit arrive); each announced unit must be gathered before the next is asked for."""
    from sc_lightning.models.convert import export_hf_unit_headers, export_hf_units

    if data_parallel_rank() != 0:
        return  # another replica: the first one exports
    pp_size, stage, tp_rank = _position()
    leader = ranks is None or ranks.leader
    owners = stage_owners(spec, pp_size) if pp_size > 1 else None
    live = {param.untyped_storage().data_ptr() for param in model.parameters()}
    headers = export_hf_unit_headers(model, spec)
    units = export_hf_units(model, spec)  # every TP peer iterates it: it joins each all-gather
    for header in headers:
        mine = owners is None or all(owners[name] == stage for name, _, _ in header)
        if leader and mine:
            yield header_bytes(header), functools.partial(_private_copy, live, units)
        elif mine and tp_rank == 0 and stage > 0:
            assert ranks is not None
            _send_unit(ranks, header, next(units))
        else:
            next(units)  # a TP peer's share of the gathers, or a unit another stage sends
    if tp_rank == 0 and stage > 0:
        assert ranks is not None
        _send_unit(ranks, None, [])  # this stage is done
    elif leader and pp_size > 1:
        assert ranks is not None
        yield from _received_units(ranks)


def _private_copy(live: set[int], units: Iterator[Named]) -> Named:
    """The next unit, each tensor copied where it shares memory with a parameter (storage in ``live``; a gathered
    tensor is private already)."""
    return [
        (name, tensor.detach().clone() if tensor.untyped_storage().data_ptr() in live else tensor)
        for name, tensor in next(units)
    ]


def _received_units(ranks: RankGroup) -> Iterator[Announced]:
    """Each later stage's units as its first tensor-parallel rank sends them, stage by stage."""
    from megatron.core import parallel_state

    senders = torch.distributed.get_process_group_ranks(parallel_state.get_pipeline_model_parallel_group())
    for sender in senders[1:]:  # in stage order
        while True:
            box: list[Any] = [None]
            torch.distributed.recv_object_list(box, src=sender, group=ranks.group)
            if box[0] is None:
                break
            yield header_bytes(box[0]), functools.partial(_receive_tensors, ranks, sender, box[0])


def _position() -> tuple[int, int, int]:
    """(pipeline stages, this rank's stage, its tensor-parallel rank); (1, 0, 0) without megatron's state."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1, 0, 0
    return (
        parallel_state.get_pipeline_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_rank(),
        parallel_state.get_tensor_model_parallel_rank(),
    )


def _send_unit(ranks: RankGroup, header: Header | None, unit: Named) -> None:
    """Send one unit to the leader: its header (None: this stage is done), then each tensor (on the CPU)."""
    torch.distributed.send_object_list([header], dst=LEADER, group=ranks.group)
    for _, tensor in unit:
        torch.distributed.send(tensor.detach().cpu().contiguous(), dst=LEADER, group=ranks.group)


def _receive_tensors(ranks: RankGroup, sender: int, header: Header) -> Named:
    """The tensors of the unit whose ``header`` just came from ``sender``."""
    unit = []
    for name, shape, dtype in header:
        tensor = torch.empty(shape, dtype=dtype)
        torch.distributed.recv(tensor, src=sender, group=ranks.group)
        unit.append((name, tensor))
    return unit
