"""The weight group: a leader broadcasts tensors to an engine in a process group of their own (gloo on CPUs)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from sc_lightning.engines.weight_group import WeightGroup, WeightGroupHost, tensor_metas


def joined_pair(timeout_s: float = 60.0) -> tuple[WeightGroup, WeightGroup]:
    """The leader's and an engine's member of one new group, built at once (gloo connects them as it builds)."""
    host = WeightGroupHost(2, "cpu", timeout_s=timeout_s)
    engine: list[WeightGroup] = []
    joiner = threading.Thread(target=lambda: engine.append(WeightGroup.join(host.address, 1, "cpu")))
    joiner.start()
    leader = host.connect()
    joiner.join(timeout=timeout_s)
    assert engine, "the engine did not join"
    return leader, engine[0]


def test_the_engine_receives_every_tensor_with_its_name_dtype_shape_and_values() -> None:
    leader, engine = joined_pair()
    sent = [
        ("fp32", torch.randn(3, 4)),
        ("bf16", torch.randn(5).to(torch.bfloat16)),
        ("fp16", torch.randn(2, 2).half()),
        ("transposed", torch.randn(4, 3).t()),  # not contiguous: sent as its values
        ("scalar", torch.tensor(7.0)),
        ("empty", torch.empty(0, 3, dtype=torch.bfloat16)),
    ]
    received: list = []
    receiver = threading.Thread(target=lambda: received.extend(engine.receive(tensor_metas(sent))))
    receiver.start()
    broadcasts = []
    broadcast = leader._broadcast
    leader._broadcast = lambda tensor: (broadcasts.append(tensor.dtype), broadcast(tensor))  # type: ignore[method-assign]
    leader.send([tensor for _, tensor in sent])
    receiver.join(timeout=60)
    assert [name for name, _ in received] == [name for name, _ in sent]
    for (_, before), (_, after) in zip(sent, received, strict=True):
        assert after.dtype == before.dtype and after.shape == before.shape and torch.equal(after, before)
    assert broadcasts == [torch.float32, torch.bfloat16, torch.float16]  # one flat buffer per dtype, not per tensor


def test_a_receiver_whose_leader_never_sends_fails_at_the_groups_deadline() -> None:
    _, engine = joined_pair(timeout_s=5.0)  # room for the setup on a loaded machine
    started = time.monotonic()
    with pytest.raises(RuntimeError):
        engine.receive([("w", (4,), "float32")])
    assert time.monotonic() - started < 30  # the deadline, not a hang
