"""Refits by broadcast: the trainer's leader and an engine actor joined in a process group of their own.

Through Ray's object store (:func:`~sc_lightning.engines.actor_client.ship_by_value`) a refit copies every weight to
host memory, into the store, and on to the engine's device. Between GPUs a broadcast over NCCL moves them device to
device instead (gloo where the engine is on a CPU). The group is a world of its own, rendezvoused through a TCP store
the leader opens on a free port: the engine is no rank of the training world, and the trainer's process groups are
untouched::

    leader                                      engine actor
    WeightGroupHost(device) ── address ──────►  WeightGroup.join(address, rank 1, device)
    host.connect()          (both at once: gloo connects every pair as the group is built)
    group.send(tensors)     ─── broadcast ───►  group.receive(metadata)  → the tensors, on the engine's device

Both sides walk the tensors in the order the metadata lists them, packed into one flat buffer per dtype: one broadcast
per dtype of a refit (or of a bucket of one). Every collective has the group's deadline: a peer that died leaves the
other side an error, not a hang.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

TensorMeta = tuple[str, tuple[int, ...], str]
"""A tensor the leader will broadcast: its name, shape and torch dtype name (``"bfloat16"``)."""


@dataclass(frozen=True)
class WeightGroupAddress:
    """Where an engine joins the leader's weight group, and the group's size and deadline."""

    host: str
    port: int
    world_size: int
    timeout_s: float


def tensor_metas(named_tensors: Sequence[tuple[str, torch.Tensor]]) -> list[TensorMeta]:
    """What a receiver needs to allocate ``named_tensors`` before they are broadcast."""
    return [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in named_tensors]


class WeightGroup:
    """One member of a weight group: rank 0 (the trainer's leader) sends, the other ranks (engines) receive."""

    def __init__(self, store: dist.Store, rank: int, address: WeightGroupAddress, device: torch.device) -> None:
        self.rank, self.device = rank, device
        self._store = store  # the group rendezvoused through it; it must live as long as the group
        timeout = datetime.timedelta(seconds=address.timeout_s)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self._group = dist.ProcessGroupNCCL(store, rank, address.world_size, options)
        else:
            self._group = dist.ProcessGroupGloo(store, rank, address.world_size, timeout)

    @classmethod
    def join(cls, address: WeightGroupAddress, rank: int, device: torch.device | str) -> WeightGroup:
        """Join the group the leader opened at ``address`` as ``rank`` (1 and up); blocks until every member has."""
        store = dist.TCPStore(
            address.host,
            address.port,
            address.world_size,
            is_master=False,
            timeout=datetime.timedelta(seconds=address.timeout_s),
        )
        return cls(store, rank, address, torch.device(device))

    def send(self, tensors: Sequence[torch.Tensor]) -> None:
        """Broadcast ``tensors`` to every engine (this is the leader, rank 0): one flat buffer per dtype, the tensors
        in order in it (a collective per tensor would cost its launch hundreds of times a refit)."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor.detach().to(self.device).reshape(-1))
        for parts in by_dtype.values():
            self._broadcast(torch.cat(parts))
        self._synchronize()

    def receive(self, metas: Sequence[TensorMeta]) -> list[tuple[str, torch.Tensor]]:
        """The tensors the leader broadcasts, as ``metas`` lists them, on this member's device (views of the flat
        buffer of their dtype)."""
        by_dtype: dict[torch.dtype, list[int]] = {}
        for index, (_, _, dtype) in enumerate(metas):
            by_dtype.setdefault(getattr(torch, dtype), []).append(index)
        received: dict[int, tuple[str, torch.Tensor]] = {}
        for dtype, indices in by_dtype.items():
            sizes = [math.prod(metas[i][1]) for i in indices]
            flat = torch.empty(sum(sizes), dtype=dtype, device=self.device)
            self._broadcast(flat)
            for i, part in zip(indices, flat.split(sizes), strict=True):
                received[i] = (metas[i][0], part.view(metas[i][1]))
        self._synchronize()
        return [received[i] for i in range(len(metas))]

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self._group.broadcast([tensor], options).wait()

    def _synchronize(self) -> None:
        """Wait for the device's queued copies (a NCCL ``wait`` orders the stream, not the host)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class WeightGroupHost:
    """The leader's side before the group exists: a TCP store on a free port of ``host`` (an address the engines
    reach: Ray's node address of the leader) that the engines join."""

    def __init__(
        self, world_size: int, device: torch.device | str, *, host: str = "127.0.0.1", timeout_s: float = 600.0
    ) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        # port 0: the store binds a free port itself (a probed port could be taken before the bind)
        self._store = dist.TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False, timeout=timeout)
        self.address = WeightGroupAddress(host, self._store.port, world_size, timeout_s)
        self.device = torch.device(device)

    def connect(self) -> WeightGroup:
        """The leader's member of the group (rank 0); blocks until every engine has joined."""
        return WeightGroup(self._store, 0, self.address, self.device)
