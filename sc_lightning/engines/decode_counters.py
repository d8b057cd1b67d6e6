"""How full an engine fleet's batch was while it decoded: its decode steps, the tokens they sampled, its KV rows.

A decode step runs every row of the engine's continuous batch one token further, so the tokens a step samples are
the rows decoding together. Their mean over an RL step, against the rows the KV cache holds, is what a long tail
costs: once most answers of a step have finished, its last ones decode a few rows at a time while the rest of the
cache sits empty (the step's weights and KV are read all the same). One step of lookahead fills those rows with the
next step's prompts ([engines](../../docs/engines.md#one-gpu-asynchronous-colocated-with-lookahead)).

The Megatron engine counts them, in this process or in its actor, and a router sums its live replicas'; an engine
that does not count decode steps (vLLM) has none to report. On a GPU they also count the decode shapes the engine
captured as CUDA graphs and the host's seconds on them: a stand-down frees the graphs with the KV cache, so a
colocated engine captures its shapes again every step, time its own warm benchmark never spends.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

from sc_lightning.engines.base import EngineError


@dataclass(frozen=True)
class DecodeCounters:
    """An engine fleet's decode work since its engines started, and the rows their KV caches hold together."""

    decode_steps: int = 0
    sampled_tokens: int = 0
    kv_slots: int = 0  # each engine's last KV-cache allocation (0 before its first)
    preemptions: int = 0  # rows a paged KV cache short of blocks sent back to the queue
    graph_captures: int = 0  # decode shapes captured as CUDA graphs (0 off a GPU)
    graph_capture_s: float = 0.0  # the host's seconds on those captures

    def __add__(self, other: DecodeCounters) -> DecodeCounters:
        """Two engines' counters together (a router's replicas)."""
        mine, theirs = dataclasses.astuple(self), dataclasses.astuple(other)
        return DecodeCounters(*(a + b for a, b in zip(mine, theirs, strict=True)))

    def since(self, earlier: DecodeCounters) -> dict[str, float]:
        """The work between ``earlier`` and these counters: ``decode_steps``, ``decode_rows_mean`` (tokens sampled
        per decode step; 0 without a step), ``decode_slots`` (the KV rows now), ``decode_preemptions`` (rows sent
        back to the queue for want of KV blocks: each computes its prefix again), ``decode_graph_captures`` and
        ``decode_graph_capture_s`` (decode shapes captured as CUDA graphs, and the host's seconds on them)."""
        steps = self.decode_steps - earlier.decode_steps
        tokens = self.sampled_tokens - earlier.sampled_tokens
        return {
            "decode_steps": float(steps),
            "decode_rows_mean": tokens / steps if steps > 0 else 0.0,
            "decode_slots": float(self.kv_slots),
            "decode_preemptions": float(self.preemptions - earlier.preemptions),
            "decode_graph_captures": float(self.graph_captures - earlier.graph_captures),
            "decode_graph_capture_s": self.graph_capture_s - earlier.graph_capture_s,
        }


async def read_decode_counters(engine: Any) -> DecodeCounters | None:
    """``engine``'s counters: a router's live replicas' summed (a dead replica's left out), an engine's own (an
    actor engine's in one call); None when none of them counts decode steps."""
    replicas = getattr(engine, "replicas", None)
    if replicas is not None:  # a router: the replicas it has not marked dead
        live = [replica for replica in replicas if replica.name not in getattr(engine, "dead", {})]
        counted = [counters for replica in live if (counters := await _read_one(replica)) is not None]
        return sum(counted, DecodeCounters()) if counted else None
    return await _read_one(engine)


async def _read_one(engine: Any) -> DecodeCounters | None:
    stats = getattr(engine, "stats", None)
    try:
        if inspect.iscoroutinefunction(stats):  # an actor engine's client (or vLLM's: no decode steps)
            stats = await stats()
    except (EngineError, TimeoutError):
        return None  # a dead or unresponsive replica: the router routes around it, and so do its counters
    values = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else stats
    if not isinstance(values, dict) or "decode_steps" not in values:
        return None
    return DecodeCounters(
        int(values["decode_steps"]),
        int(values["generated_tokens"]),
        int(values.get("kv_slots", 0)),
        int(values.get("preemptions", 0)),
        int(values.get("graph_captures", 0)),
        float(values.get("graph_capture_s", 0.0)),
    )
