"""Decode counters (sc_lightning/engines/decode_counters.py): read from an engine in this process, from an actor
engine's ``stats`` call, summed over a router's live replicas, absent for an engine that does not count them; and the
per-step figures GoodputMonitor logs (the fit's, in tests/test_e2e_benchmark.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from sc_lightning.engines.base import EngineError
from sc_lightning.engines.decode_counters import DecodeCounters, read_decode_counters
from sc_lightning.engines.megatron.worker import EngineStats
from sc_lightning.engines.router import EngineRouter


@dataclass
class InProcess:
    """Stands in for a Megatron engine in this process: ``stats`` is its EngineStats."""

    name: str
    stats: EngineStats = field(default_factory=EngineStats)


class ByCall:
    """Stands in for an actor engine's client (``stats`` answers a dict) or for vLLM (no decode steps)."""

    def __init__(self, name: str, answer: dict[str, int] | EngineError) -> None:
        self.name, self.answer, self.calls = name, answer, 0

    async def stats(self) -> dict[str, int]:
        self.calls += 1
        if isinstance(self.answer, EngineError):
            raise self.answer
        return self.answer


def read(engine: Any) -> DecodeCounters | None:
    return asyncio.run(read_decode_counters(engine))


def test_an_engine_in_this_process_and_an_actor_engine_report_their_counters() -> None:
    stats = EngineStats(decode_steps=10, generated_tokens=640, kv_slots=128, prefill_chunks=3)
    assert read(InProcess("e0", stats)) == DecodeCounters(10, 640, 128)
    actor = {"decode_steps": 4, "generated_tokens": 200, "kv_slots": 64, "finished_requests": 2, "preemptions": 3}
    assert read(ByCall("e1", actor)) == DecodeCounters(4, 200, 64, 3)
    assert read(ByCall("vllm", {"requests": 3, "generated_tokens": 90})) is None  # vLLM counts no decode steps


def test_a_router_sums_its_live_replicas_and_leaves_out_the_dead_and_the_failing() -> None:
    failing = ByCall("e2", EngineError("engine 'e2', stats: the actor died"))
    marked = ByCall("e3", {"decode_steps": 1000, "generated_tokens": 1000, "kv_slots": 1})
    replicas = [InProcess("e0", EngineStats(decode_steps=10, generated_tokens=600, kv_slots=64)), failing, marked]
    replicas.append(ByCall("e1", {"decode_steps": 5, "generated_tokens": 100, "kv_slots": 64}))
    router = EngineRouter(replicas)
    router.dead["e3"] = "its actor died"
    assert read(router) == DecodeCounters(15, 700, 128)
    assert failing.calls == 1 and marked.calls == 0  # a replica marked dead is not asked
    assert read(EngineRouter([ByCall("vllm", {"requests": 1})])) is None


def test_a_steps_figures_are_the_difference_of_two_readings() -> None:
    before, after = DecodeCounters(10, 600, 64, 2, 5, 0.25), DecodeCounters(30, 1400, 64, 5, 12, 1.0)
    figures = {
        "decode_steps": 20.0,
        "decode_rows_mean": 40.0,
        "decode_slots": 64.0,
        "decode_preemptions": 3.0,
        "decode_graph_captures": 7.0,
        "decode_graph_capture_s": 0.75,
    }
    assert after.since(before) == figures
    assert before.since(before)["decode_rows_mean"] == 0.0  # no decode step in the window
    total = DecodeCounters(1, 2, 3, 4, 5, 0.5) + DecodeCounters(10, 20, 30, 40, 50, 1.0)
    assert total == DecodeCounters(11, 22, 33, 44, 55, 1.5)


def test_an_actor_engines_graph_captures_are_read_with_its_other_counters() -> None:
    actor = {"decode_steps": 4, "generated_tokens": 200, "kv_slots": 64, "graph_captures": 9, "graph_capture_s": 0.5}
    assert read(ByCall("e1", actor)) == DecodeCounters(4, 200, 64, 0, 9, 0.5)
    stats = EngineStats(decode_steps=3, generated_tokens=30, graph_captures=2, graph_capture_s=0.125)
    assert read(InProcess("e0", stats)) == DecodeCounters(3, 30, 0, 0, 2, 0.125)
