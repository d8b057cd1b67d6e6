"""The Megatron engine's running batch: continuous batching over KV slots.

Runs on the worker thread of :class:`~sc_lightning.engines.megatron.engine.MegatronEngine` only (synchronous
torch). Every running request owns one slot of a preallocated
:class:`~sc_lightning.engines.megatron.kv_cache.SlotKVCache` and its own count of cached positions; requests join
(:meth:`ContinuousBatch.add`) and leave (finished, cancelled) between any two steps. One
:meth:`ContinuousBatch.step`:

1. **Prefill, one chunk.** Rows whose prefix (prompt + tokens sampled so far; all of it after a weight update or a
   stand-down) is not yet cached up to its last token get at most ``prefill_tokens`` positions between them, oldest
   first: one forward that only fills the cache. A long prompt takes several steps, and decoding goes on in
   between, so it never starves the running rows. A prompt with images (a VLM) is fed its merged embeddings (its
   ``<image>`` positions are its images' projected patches), computed once per weight version and sliced per chunk;
   decoding never meets an image (a prompt's last token is text). Rows of one text prompt (a prompt group's
   completions) prefill it once: the others copy its K/V from the row that wrote them, right after the chunk that
   ends it, and decode in the same step (:mod:`~sc_lightning.engines.megatron.prompt_copies`).
2. **Decode.** Every row whose prefix is cached up to its last token feeds that token at its own position (a device
   tensor), all rows in one forward; each samples its next token
   (:func:`~sc_lightning.engines.megatron.decode_sampling.sample_next`, its own noise stream) and reads it back with
   the others (one device sync per step). Rows still prefilling ride along as placeholders: they write scratch K/V at
   the position their next chunk overwrites.
3. **Leave.** Finished rows reply; the last slot's K/V move into a freed slot, so rows always fill slots
   ``0..n-1`` and a decode step reads the cache as a view.

Every row is exact: a position's K/V are those of the model fed the row's own prefix (the same RoPE positions as
the trainer, from 0), and attention masks everything past a row's own position, so the logits equal a full
forward of the same tokens (up to floating-point summation order).

**Shapes.** On a GPU the decode step runs as a CUDA graph per (batch, KV length) bucket
(:mod:`~sc_lightning.engines.megatron.cuda_graphs`): the batch is padded to a power of two with idle rows (they write
position 0 of free slots) and attention reads a bucketed number of positions
(:func:`~sc_lightning.engines.megatron.kv_cache.kv_bucket`). On the CPU, shapes are exact and nothing is captured.

**Overlap** (on by default on a GPU). A decode step is read at the next :meth:`ContinuousBatch.step`, and when the
rows are the same and all decoding (nothing joined, left, or waits for a prefill), that call first queues the next
step, fed the tokens still on the device, then reads the previous one: the host's bookkeeping runs while the GPU
computes. A row that finished meanwhile rides along one step for nothing (its result is dropped, its scratch K/V
land in a slot it no longer owns). Before any command the engine calls :meth:`~ContinuousBatch.drain`.

**Per-token versions.** A decode step is read with the version of the weights that computed it (the engine drains
the step in flight before it loads weights, and holds decoding while a refit's buckets load), and each token sampled
records that version (``Generation.token_versions``): a completion that spans a refit carries both versions, split
exactly at the step boundary where the new weights came in.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sc_lightning.engines.megatron.cached_forward import CachedForward
from sc_lightning.engines.megatron.cuda_graphs import DecodeGraphs
from sc_lightning.engines.megatron.decode_sampling import sample_next, to_device
from sc_lightning.engines.megatron.kv_cache import batch_bucket, kv_bucket
from sc_lightning.engines.megatron.kv_rows import KVLayout, KVRows
from sc_lightning.engines.megatron.paged_kv import KVCache
from sc_lightning.engines.megatron.prompt_copies import prompt_copies
from sc_lightning.engines.megatron.request import Request
from sc_lightning.types import FinishReason


@dataclass(eq=False)
class _Row:
    """A running request, how many positions of its prefix are in its slot, and how many more are being written."""

    request: Request
    admitted: int = 0  # the order rows joined in: a paged cache short of blocks preempts the newest
    cached: int = 0
    in_flight: int = 0  # positions written by a decode step the host has not read yet
    left: bool = False  # finished or cancelled: a decode step still in flight ignores its result
    prompt_embeddings: Tensor | None = None  # (P, h) an image prompt's merged embeddings, for the current weights

    @property
    def waiting(self) -> int:
        """Prefix positions still to prefill before the row can decode (its last token is fed by a decode step)."""
        return self.request.length - 1 - self.cached

    @functools.cached_property
    def prompt_key(self) -> tuple[tuple[int, int], int] | None:
        """``((hash, length) of the prompt, positions another row may copy)``, or None for a prompt with images."""
        prompt = self.request.prompt
        return None if self.request.images is not None else ((hash(prompt), len(prompt)), len(prompt) - 1)


@dataclass(eq=False)
class _Launched:
    """A decode step queued on the device: its rows (the order of its results), their positions, its results."""

    rows: list[_Row]
    positions: list[int]
    tokens: Tensor  # (N,) on the device
    logprobs: Tensor  # (N,)


class ContinuousBatch:
    """The running requests, one KV-cache slot each, advanced by :meth:`step` (chunked prefill, then one decode)."""

    def __init__(
        self,
        forward: CachedForward,
        parameters: list[Tensor],
        *,
        max_rows: int,
        max_seq_len: int,
        vocab_size: int,
        prefill_tokens: int,
        cuda_graphs: bool,
        buckets: bool | None = None,
        overlap: bool | None = None,
        memory_fraction: float | None = None,
        kv_layout: KVLayout = "paged",
        kv_blocks: int | None = None,
        embed_prompt: Callable[[Request], Tensor] | None = None,
        mask_logits: Callable[[Tensor], None] | None = None,
    ) -> None:
        self.forward = forward
        self.mask_logits = mask_logits  # a VLM's: <image> is never a next token (in place, on the decode logits)
        self.embed_prompt = embed_prompt  # a VLM's merged prompt embeddings (P, h) of a request with images
        self.max_rows = max_rows
        self.memory_fraction = memory_fraction
        self.max_seq_len = max_seq_len
        self.vocab_size = vocab_size
        self.prefill_tokens = prefill_tokens
        self.device = forward.device
        on_gpu = self.device.type == "cuda"
        self.graphs = DecodeGraphs(self._decode_step, parameters) if cuda_graphs else None
        self.buckets = cuda_graphs or on_gpu if buckets is None else buckets
        self.overlap = on_gpu if overlap is None else overlap
        self.rows: list[_Row] = []  # rows[i] owns slot i of the cache
        self.kv = KVRows(
            forward,
            layout=kv_layout,
            max_rows=max_rows,
            max_seq_len=max_seq_len,
            memory_fraction=memory_fraction,
            blocks=kv_blocks,
        )
        self._admissions = itertools.count()
        self.returned: list[Request] = []  # rows the cache had no slot for at its allocation: to join again
        self._launched: _Launched | None = None
        self._joined = False
        self.decode_steps = 0
        self.prefill_calls = 0
        self.sampled_tokens = 0
        self.copied_positions = 0  # prompt positions rows took by copy instead of prefilling them
        self.preemptions = 0  # rows a dry paged pool sent back to the queue

    @property
    def cache(self) -> KVCache | None:
        """The KV cache (None until the first request, and after :meth:`release`)."""
        return self.kv.cache

    @property
    def capacity(self) -> int:
        """Rows the batch may hold: the cache's slots once allocated, else ``max_rows``."""
        return self.cache.slots if self.cache is not None else self.max_rows

    def add(self, request: Request) -> None:
        """Let ``request`` join at the next step (the caller keeps at most :attr:`capacity` rows)."""
        self.rows.append(_Row(request, next(self._admissions)))
        self._joined = True

    def requests(self) -> list[Request]:
        """The running requests, in slot order."""
        return [row.request for row in self.rows]

    def clear(self) -> list[Request]:
        """Remove every row (a decode step in flight is dropped unread); returns their requests."""
        requests, self.rows, self._launched = self.requests(), [], None
        return requests

    def drain(self, version: int) -> list[tuple[Request, FinishReason]]:
        """Read the decode step still in flight, if any; returns the requests it finished."""
        launched, self._launched = self._launched, None
        return self._read(launched, version) if launched is not None else []

    def weights_changed(self) -> None:
        """Recompute every row's K/V with the new weights (call :meth:`drain` first; graphs stay valid while the
        parameters do)."""
        self.kv.forget(len(self.rows))
        for row in self.rows:
            row.cached = 0
            row.prompt_embeddings = None  # the vision tower may have changed too
        if self.graphs is not None and not self.graphs.still_valid():
            self.graphs.clear()

    def release(self) -> None:
        """Free the KV cache and the CUDA graphs (call :meth:`drain` first); rows stay and are prefilled again."""
        if self.graphs is not None:
            self.graphs.clear()
        self.kv.cache = None
        for row in self.rows:
            row.cached = 0

    def step(self, version: int) -> list[tuple[Request, FinishReason]]:
        """One prefill chunk (if rows wait for one) and one decode step; returns the requests that finished.

        ``version`` is recorded as the start version of requests sampling their first token. Cancelled requests
        leave without a reply. With ``overlap`` a decode step is read at the next call: when nothing joined, left or
        waits for a prefill, the next step is queued first, fed the tokens still on the device, so the device never
        waits for the host.
        """
        finished: list[tuple[Request, FinishReason]] = []
        launched, self._launched = self._launched, None
        if launched is not None:
            if self._can_chain(launched):
                self._launched = self._launch(list(range(len(self.rows))), chained=launched)
            finished = self._read(launched, version)
            if self._launched is not None:
                return finished
        self._remove([i for i, row in enumerate(self.rows) if row.request.cancelled.is_set()])
        if not self.rows:
            return finished
        if self.cache is None:
            self._allocate()
        self._joined = False
        waiting = self._copy_prompts(self._waiting())
        if waiting:
            self._prefill(waiting)
            self._copy_prompts(self._waiting())  # the siblings of a prompt just prefilled decode beside it
        self._make_room()
        ready = [i for i, row in enumerate(self.rows) if row.waiting == 0]
        if ready:
            launched = self._launch(ready)
            if self.overlap:
                self._launched = launched
            else:
                finished += self._read(launched, version)
        return finished

    def _allocate(self) -> None:
        """Allocate the KV cache (:class:`~sc_lightning.engines.megatron.kv_rows.KVRows`); rows beyond the rows it
        holds (nothing cached yet) move to :attr:`returned`."""
        slots = self.kv.allocate()
        self.returned += [row.request for row in self.rows[slots:]]
        del self.rows[slots:]

    def _can_chain(self, launched: _Launched) -> bool:
        """Whether the next decode step can be queued before ``launched`` is read: same rows, all decoding."""
        return (
            not self._joined
            and launched.rows == self.rows
            and all(p + 1 < self.max_seq_len for p in launched.positions)
            and not any(row.request.cancelled.is_set() for row in self.rows)
            and all(self.kv.reserve(i, p + 2) for i, p in enumerate(launched.positions))  # the next position's room
        )

    def _make_room(self) -> None:
        """Every decoding row can write its next position: a paged cache short of blocks preempts the newest rows
        (their requests return to the queue, to prefill again later) until it is not."""
        while True:
            if all(row.waiting > 0 or self.kv.reserve(i, row.cached + 1) for i, row in enumerate(self.rows)):
                return
            self._preempt_newest()

    def _preempt_newest(self) -> None:
        """Take the newest row out (its blocks back to the pool); its request returns to the queue, to join and
        prefill again later (what it sampled so far stays with it)."""
        if len(self.rows) == 1:  # alone and still short: it would step aside and come back forever
            raise RuntimeError(
                "the paged KV cache cannot hold this request's next positions even alone: give the engine more memory "
                "(policy.generation.mcore_generation_config.kv_cache_memory_fraction) or lower "
                "policy.max_total_sequence_length"
            )
        newest = max(range(len(self.rows)), key=lambda i: self.rows[i].admitted)
        self.returned.append(self.rows[newest].request)
        self.preemptions += 1
        self._remove([newest])

    def _kv_len(self, positions: int) -> int:
        """How many cache positions a call reads when its furthest token sits at ``positions - 1``."""
        assert self.cache is not None
        return kv_bucket(positions, self.cache.length) if self.buckets else positions

    def _waiting(self) -> list[int]:
        """The rows whose prefix is not yet cached up to its last token, oldest first."""
        return [i for i, row in enumerate(self.rows) if row.waiting > 0]

    def _copy_prompts(self, waiting: list[int]) -> list[int]:
        """Give rows of ``waiting`` the K/V of their prompt that another row has written, by copy; returns the rows to
        prefill now (not the fresh rows whose prompt another row prefills now: they copy it once it is written, in
        the same step when its prefill ends there)."""
        assert self.cache is not None
        if not waiting:
            return waiting
        rows = self.rows
        copies, prefill = prompt_copies([row.prompt_key for row in rows], [row.cached for row in rows], waiting)
        for source, target, positions in copies:
            if rows[source].request.prompt == rows[target].request.prompt:  # not merely the same hash
                taken = self.kv.take_prompt(source, target, positions)
                rows[target].cached = taken
                self.copied_positions += taken
        return [i for i in prefill if rows[i].waiting > 0]

    def _plan_prefill(self, waiting: list[int]) -> tuple[list[int], int]:
        """Rows (oldest first) and a chunk width such that rows x width stays within ``prefill_tokens``."""
        chosen: list[int] = []
        width = 0
        for i in waiting:
            wider = max(width, min(self.rows[i].waiting, self.prefill_tokens))
            if chosen and (len(chosen) + 1) * wider > self.prefill_tokens:
                break
            chosen.append(i)
            width = wider
        return chosen, width

    def _prefill(self, waiting: list[int]) -> None:
        """Cache the next chunk of the prefixes of some ``waiting`` rows (short rows padded with scratch tokens)."""
        assert self.cache is not None
        chosen, width = self._plan_prefill(waiting)
        chosen = [i for i in chosen if self.kv.reserve(i, self.rows[i].cached + min(self.rows[i].waiting, width))]
        if not chosen:  # a paged cache has no block for any of them: decoding rows free some as they finish,
            if all(row.waiting > 0 for row in self.rows):  # and when none decodes, the newest row makes room
                self._preempt_newest()
            return
        tokens, positions, spans = [], [], []
        last = self.max_seq_len - 1
        for i in chosen:
            row = self.rows[i]
            take = min(row.waiting, width)
            tokens.append(row.request.tokens_between(row.cached, row.cached + take) + [0] * (width - take))
            positions.append([min(row.cached + t, last) for t in range(width)])  # scratch past `take`
            spans.append((row.cached, row.cached + take))
            row.cached += take
        kv_len = self._kv_len(max(p[-1] for p in positions) + 1)
        token_ids = to_device(tokens, torch.long, self.device)
        self.forward(
            self.cache,
            token_ids,
            to_device(positions, torch.long, self.device),
            kv_len=kv_len,
            slots=to_device(chosen, torch.long, self.device),
            logits=False,
            embeddings=self._image_embeddings(chosen, token_ids, spans),
        )
        self.prefill_calls += 1

    def _image_embeddings(self, chosen: list[int], token_ids: Tensor, spans: list[tuple[int, int]]) -> Tensor | None:
        """A prefill chunk's input embeddings ``(R, W, h)`` when one of its rows has images: the word embeddings,
        each such row's prompt positions ``spans[k]`` taken from its merged prompt embeddings (computed once per
        weight version); None when no row has images (the forward embeds the tokens)."""
        imaged = [k for k, i in enumerate(chosen) if self.rows[i].request.images is not None]
        if not imaged:
            return None
        assert self.embed_prompt is not None
        embeddings = self.forward.embedding(token_ids)  # (R, W, h)
        for k in imaged:
            row = self.rows[chosen[k]]
            if row.prompt_embeddings is None:
                row.prompt_embeddings = self.embed_prompt(row.request)
            start, stop = spans[k][0], min(spans[k][1], len(row.request.prompt))  # sampled tokens: word embeddings
            if stop > start:
                embeddings[k, : stop - start] = row.prompt_embeddings[start:stop]
        return embeddings

    def _decode_step(self, inputs: Tensor, kv_len: int) -> Tensor:
        """Logits ``(B, vocab)`` fp32 of feeding ``inputs[0]`` at positions ``inputs[1]`` to rows ``0..B-1``."""
        assert self.cache is not None
        logits = self.forward(self.cache, inputs[0][:, None], inputs[1][:, None], kv_len=kv_len)
        assert logits is not None
        logits = logits[:, : self.vocab_size].float()
        if self.mask_logits is not None:
            self.mask_logits(logits)
        return logits

    def _launch(self, ready: list[int], chained: _Launched | None = None) -> _Launched:
        """Queue the decode forward of every row (placeholders for rows not ready) and the sampling of ``ready``.

        A ``chained`` step feeds the tokens ``chained`` sampled (still on the device), one position further.
        """
        assert self.cache is not None
        batch = batch_bucket(len(self.rows), self.capacity) if self.buckets else len(self.rows)
        tokens, positions = [0] * batch, [0] * batch
        for i, row in enumerate(self.rows):
            if chained is not None:
                positions[i] = chained.positions[i] + 1
            elif row.waiting == 0:
                tokens[i], positions[i] = row.request.last_token, row.cached
            else:
                positions[i] = row.cached  # scratch K/V where the row's next prefill chunk starts
        kv_len = self.cache.length if self.forward.flash else self._kv_len(max(positions) + 1)
        host = torch.tensor([tokens, positions], dtype=torch.long)
        fed = chained.tokens if chained is not None else None
        if self.graphs is not None:
            logits = self.graphs.run(host.pin_memory(), kv_len, fed)
        else:
            inputs = host.to(self.device)
            if fed is not None:
                inputs[0, : fed.size(0)] = fed
            logits = self._decode_step(inputs, kv_len)
        self.decode_steps += 1
        if ready == list(range(len(ready))):
            logits = logits[: len(ready)]
        else:
            logits = logits.index_select(0, to_device(ready, torch.long, self.device))
        rows = [self.rows[i] for i in ready]
        for row in rows:
            row.in_flight += 1
        requests = [row.request for row in rows]
        sampled, logprobs = sample_next(logits, [r.sampling for r in requests], [r.noise for r in requests])
        return _Launched(rows, [positions[i] for i in ready], sampled, logprobs)

    def _read(self, launched: _Launched, version: int) -> list[tuple[Request, FinishReason]]:
        """Wait for ``launched`` and record its tokens; rows that finish leave. Returns the finished requests."""
        tokens, logprobs = torch.stack([launched.tokens.double(), launched.logprobs.double()]).cpu().tolist()
        finished: list[tuple[Request, FinishReason]] = []
        for row, token, logprob in zip(launched.rows, tokens, logprobs, strict=True):
            row.in_flight -= 1
            if row.left:
                continue
            row.cached += 1
            request = row.request
            if request.start_version is None:
                request.start_version = version
            request.tokens.append(int(token))
            request.logprobs.append(logprob)
            request.versions.append(version)
            self.sampled_tokens += 1
            reason = self._finish_reason(request)
            if reason is not None:
                finished.append((request, reason))
                row.left = True
        self._remove([i for i, row in enumerate(self.rows) if row.left])
        return finished

    def _finish_reason(self, request: Request) -> FinishReason | None:
        """Why ``request`` is done after its latest token, or None while it goes on."""
        if request.tokens[-1] in request.stop_ids:
            return "stop"
        if request.length >= request.total_limit(self.max_seq_len):
            return "length"
        return None

    def _remove(self, indices: Sequence[int]) -> None:
        """Drop the rows at ``indices``; the last rows move into the freed slots (their K/V with them, including
        positions a decode step in flight writes)."""
        for i in sorted(indices, reverse=True):
            self.rows[i].left = True
            last = len(self.rows) - 1
            moved = self.rows[last]
            self.kv.remove(i, last, moved.cached + moved.in_flight)
            if i != last:
                self.rows[i] = moved
            self.rows.pop()
