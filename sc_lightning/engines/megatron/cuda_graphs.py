"""CUDA graphs of the Megatron engine's decode step, one per (batch bucket, KV-length bucket), captured on first use.

A decode step launches a few hundred small kernels; replaying them as one graph removes the host's launch cost
(which, eager, is ten times the GPU's work at batch 64). :class:`DecodeGraphs` keeps, per shape, a static input
buffer ``(2, batch)`` (tokens, positions), the captured graph and its static logits. A step copies its inputs into
the buffer (from pinned memory, asynchronously) and replays; the logits must be consumed before the next replay of
any graph (the engine samples them right away, on the same stream).

**First use of a shape** runs the step eagerly on a side stream with the real inputs (warming up cuBLAS and the
allocator; its logits are this step's result), then captures it without running it. The eager run and every
later replay write the same K/V at the same positions, so running it twice is harmless. Capture is
``thread_local``: a trainer in another thread of the process (colocated placement) may use the GPU meanwhile.
:attr:`DecodeGraphs.captures` and :attr:`DecodeGraphs.capture_s` count the shapes captured and the host's seconds
for them (eager run and capture), over every :meth:`DecodeGraphs.clear`: a stand-down frees the graphs, so each
wake captures its shapes again.

**Validity.** A graph holds raw pointers: to the model's parameters (a weight update copies into them in place,
:meth:`DecodeGraphs.still_valid` checks it), to the KV cache and to the RoPE tables. Whoever frees the cache must
:meth:`DecodeGraphs.clear` first. All graphs share one memory pool, released with them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

StepFn = Callable[[Tensor, int], Tensor]  # (inputs (2, B) on the device, kv_len) -> logits (B, V)


@dataclass
class _Captured:
    """One captured decode step: its static input buffer, the graph and the logits it writes."""

    inputs: Tensor
    graph: torch.cuda.CUDAGraph
    logits: Tensor


class DecodeGraphs:
    """Lazily captured CUDA graphs of ``step`` (inputs ``(2, batch)``, ``kv_len``) -> logits, per shape."""

    def __init__(self, step: StepFn, parameters: list[Tensor]) -> None:
        self._step = step
        self._parameters = parameters
        self._pointers = [p.data_ptr() for p in parameters]
        self._graphs: dict[tuple[int, int], _Captured] = {}
        self._pool: tuple[int, int] | None = None
        self._stream: torch.cuda.Stream | None = None
        self.captures = 0  # shapes captured since the engine started, across clears
        self.capture_s = 0.0  # the host's seconds on them: each shape's eager first run and its capture

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, inputs: Tensor, kv_len: int, tokens: Tensor | None = None) -> Tensor:
        """The logits ``(batch, V)`` of the decode step for ``inputs`` ``(2, batch)`` (pinned host memory).

        ``tokens`` (on the device), when given, replace the first ``len(tokens)`` tokens of ``inputs``: a step can
        feed what the previous one sampled before the host has read it.
        """
        key = (inputs.size(1), kv_len)
        captured = self._graphs.get(key)
        static = (
            captured.inputs if captured is not None else torch.empty(inputs.shape, dtype=inputs.dtype, device="cuda")
        )
        static.copy_(inputs, non_blocking=True)
        if tokens is not None:
            static[0, : tokens.size(0)].copy_(tokens)
        if captured is None:
            return self._capture(key, static)
        captured.graph.replay()
        return captured.logits

    def _capture(self, key: tuple[int, int], static: Tensor) -> Tensor:
        """Run the step for ``static`` eagerly on a side stream, then capture it for ``key``; returns the logits."""
        start = time.perf_counter()
        main = torch.cuda.current_stream()
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        self._stream.wait_stream(main)
        with torch.cuda.stream(self._stream):
            logits = self._step(static, key[1])  # this step's result, and the warm-up before capture
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
            try:
                out = self._step(static, key[1])
            finally:
                graph.capture_end()
        main.wait_stream(self._stream)
        self._graphs[key] = _Captured(static, graph, out)
        self.captures += 1
        self.capture_s += time.perf_counter() - start
        return logits

    def still_valid(self) -> bool:
        """Whether the model's parameters are still the tensors the graphs were captured with."""
        return [p.data_ptr() for p in self._parameters] == self._pointers

    def clear(self) -> None:
        """Drop every graph and the memory they hold (before the KV cache they read is freed or replaced)."""
        self._graphs.clear()
        self._pool = None
        self._pointers = [p.data_ptr() for p in self._parameters]
