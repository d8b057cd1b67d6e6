"""The Megatron generation engine: KV-cache sampling from a megatron-core ``GPTModel``, many requests in flight.

:class:`MegatronEngine` implements :class:`~sc_lightning.engines.base.GenerationEngine` in the caller's process
(colocated placement); :class:`~sc_lightning.engines.megatron.ray_engine.RayMegatronEngine` runs one in a Ray actor.

**Threads.** ``generate`` enqueues a request and awaits a future; one worker thread
(:class:`~sc_lightning.engines.megatron.worker.DecodeWorker`) owns the model and runs the step loop of a
:class:`~sc_lightning.engines.megatron.batch.ContinuousBatch`, handing each result back to its event loop with
``call_soon_threadsafe``. The event loop never blocks on the model.

**Batching policy: continuous.** Before every step, pending requests join the running batch (FIFO) while it has
fewer than ``max_batch_size`` rows, each in its own slot of a KV cache preallocated for ``max_batch_size`` x
``max_seq_len`` positions. A step prefills one chunk of the newcomers' prompts (at most ``prefill_chunk_tokens``
positions: a long prompt spreads over several steps and never stalls the rows decoding), then decodes one token for
every row whose prompt is cached; a row leaves the moment it finishes and its slot goes to the next request. So one
long completion never holds finished ones, and a request arriving mid-run starts at the next step. Rows decode
exactly (see :mod:`~sc_lightning.engines.megatron.batch`). On a GPU the decode step replays a CUDA graph per (batch,
KV length) bucket (:mod:`~sc_lightning.engines.megatron.cuda_graphs`), queued before the host reads the previous step.
Sampling follows :mod:`~sc_lightning.engines.sampling`'s conventions, each request drawing from its own seeded
noise stream (:mod:`~sc_lightning.engines.megatron.decode_sampling`): the same tokens whatever shares its batch.

**Interruptions.** Between two steps the worker applies control commands; running requests keep their slots.

- ``update_weights(named_tensors, version)``: HF-named tensors (as ``export_hf_weights`` yields them; the iterable
  is consumed on the worker thread) are converted and loaded in place — or megatron-named ones (a same-architecture
  model's :func:`~sc_lightning.models.megatron.megatron_weights`, what a colocated trainer passes: its live
  parameters, read before the call returns) copied straight in, one multi-tensor copy; ``weight_version`` becomes
  ``version``;
  requests in flight continue on the new weights (their KV cache is recomputed with them: prefilled again from
  prompt + tokens so far). ``Generation.weight_version`` is the version that sampled the request's *first* token
  (its start), ``Generation.token_versions`` the version that sampled each token (exact at the step boundary
  where the weights changed); the controller records end versions itself.
- ``stage_weights(named_tensors, version)``: one bucket of a refit's HF-named weights (more follow), loaded in
  place; decoding then holds (no token comes from a half-loaded model) until the ``update_weights`` that brings the
  last bucket, which checks that the version's buckets covered every parameter, adopts ``version`` and resumes.
- ``stand_down()``: stops decoding after the current step, frees the KV cache and the CUDA graphs and stops the
  engine's :class:`~sc_lightning.engines.megatron.clock.ActiveClock`; requests (running or new) wait. ``wake()``
  resumes them (running ones are prefilled again). :meth:`MegatronEngine.active_deadline` /
  :meth:`MegatronEngine.active_wait_for` give per-request deadlines that exclude stood-down time.
- ``shutdown()``: requests still waiting or running end with ``finish_reason="abort"`` (the tokens they have);
  later calls raise :class:`~sc_lightning.engines.base.EngineError`.

**Images** (a vision-language model, :mod:`sc_lightning.models.vlm`): ``generate(..., images=...)`` takes the
prompt's images (uint8 ``(N, H, W, 3)``, one per run of ``tokens_per_image`` ``<image>`` ids). Their prefill
chunks are fed the merged embeddings (the vision tower and projector run once per request and weight version),
decoding is the language model's as for text (``<image>`` is never sampled: its logit is the trainer's
:data:`~sc_lightning.models.vlm.NEVER_LOGIT`), and a refit carries the vision side too (its weights are the
model's parameters like any other: a megatron-named update copies them, an HF-named one carries them under their
megatron names, :mod:`~sc_lightning.models.vlm_weights`).

Limits: one TP=1, PP=1 replica per engine (megatron's parallel state is process-global, so a colocated engine needs
a TP=1, PP=1 trainer process); prompts must be shorter than ``max_seq_len``.

This module is the event-loop side: checks, requests and commands in, results out. The worker thread, the batch,
the forward, the graphs and the clock are collaborators in their own modules of this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import random
from collections.abc import Awaitable, Iterable
from functools import partial
from typing import Any, ClassVar, TypeVar

import torch
from megatron.core import parallel_state

from sc_lightning.engines.base import EngineError
from sc_lightning.engines.megatron.batch import ContinuousBatch
from sc_lightning.engines.megatron.cached_forward import CachedForward
from sc_lightning.engines.megatron.clock import ActiveClock
from sc_lightning.engines.megatron.decode_sampling import noise_stream
from sc_lightning.engines.megatron.kv_cache import FP8
from sc_lightning.engines.megatron.kv_rows import KVLayout
from sc_lightning.engines.megatron.request import Request, replier
from sc_lightning.engines.megatron.worker import Command, CommandKind, DecodeWorker, EngineStats, request_error
from sc_lightning.models.megatron import build_policy, load_policy
from sc_lightning.models.spec import ModelSpec
from sc_lightning.models.vlm import language_model_of, merged_embeddings, never_predict, vision_of
from sc_lightning.types import Generation, SamplingParams

T = TypeVar("T")
KV_CACHE_DTYPES = {"auto": None, "fp8": FP8}  # kv_cache_dtype: the K/V cache's dtype (None: the model's)


class MegatronEngine:
    """A :class:`GenerationEngine` over a megatron-core ``GPTModel`` (continuous batching on a KV cache, one thread).

    ``accepts_megatron_weights``: ``update_weights`` also takes a same-architecture model's megatron-named
    parameters, and is done reading them when it returns (a colocated trainer passes its live ones, uncopied).

    ``model`` must be the engine's own replica (it is switched to eval mode and only the worker thread touches it);
    ``spec`` its architecture. Stop tokens: ``eos_token_id`` (when ``stop_on_eos``) plus ``extra_stop_token_ids``,
    plus any given to ``generate``; a stop token ends the completion and is included in it. ``max_seq_len`` caps
    prompt + completion (default: the model's ``max_position_embeddings``); the KV cache holds ``max_batch_size``
    sequences of that length, or on a GPU as many as ``kv_cache_memory_fraction`` of the device memory free when the
    cache is allocated (at the first request and at each wake) holds; requests beyond its rows wait.
    ``kv_cache_dtype`` "auto" keeps K/V in the model's dtype, "fp8" in fp8 (e4m3): half the bytes, so twice the rows
    in the same memory and half the K/V a decode step reads, for K/V rounded to 3 mantissa bits (see
    :mod:`~sc_lightning.engines.megatron.kv_cache`). ``kv_cache_layout`` "slots" gives each row the whole context,
    "paged" blocks of 64 positions as it grows (:mod:`~sc_lightning.engines.megatron.kv_rows`; ``kv_cache_blocks``
    fixes the pool's size, else the memory budget or every row's whole context decides): more rows in the same
    memory, the newest preempted when the blocks run out.
    ``prefill_chunk_tokens`` bounds the prompt positions prefilled per step.
    ``cuda_graphs`` (default: on a GPU) replays the decode step as CUDA graphs; ``flash_decode`` decodes on flash
    attention's varlen kernel (bf16/fp16 on a GPU; see :mod:`~sc_lightning.engines.megatron.cached_forward`);
    ``fused_decode`` runs the forward on fused Triton kernels (residual + RMSNorm, RoPE + K/V write, decode
    attention; default: wherever they can run, which is a GPU without ``flash_decode``).
    ``seed`` seeds the noise of requests without ``SamplingParams.seed``. ``weight_version`` is the version of
    ``model``'s weights.
    """

    accepts_megatron_weights: ClassVar[bool] = True

    def __init__(
        self,
        model: torch.nn.Module,
        spec: ModelSpec,
        *,
        eos_token_id: int | None,
        name: str = "megatron",
        max_batch_size: int = 64,
        max_seq_len: int | None = None,
        prefill_chunk_tokens: int = 1024,
        kv_cache_memory_fraction: float = 0.9,
        kv_cache_dtype: str = "auto",
        kv_cache_layout: KVLayout = "paged",
        kv_cache_blocks: int | None = None,
        cuda_graphs: bool | None = None,
        flash_decode: bool = False,
        fused_decode: bool | None = None,
        extra_stop_token_ids: Iterable[int] = (),
        stop_on_eos: bool = True,
        seed: int = 0,
        weight_version: int = 0,
    ) -> None:
        if parallel_state.get_tensor_model_parallel_world_size() != 1 or (
            parallel_state.get_pipeline_model_parallel_world_size() != 1
        ):
            raise ValueError(f"engine {name!r}: MegatronEngine runs a TP=1, PP=1 model replica")
        for knob, value in (("max_batch_size", max_batch_size), ("prefill_chunk_tokens", prefill_chunk_tokens)):
            if value < 1:
                raise ValueError(f"engine {name!r}: {knob} must be >= 1, got {value}")
        if not 0 < kv_cache_memory_fraction <= 1:
            fraction = kv_cache_memory_fraction
            raise ValueError(f"engine {name!r}: kv_cache_memory_fraction must be in (0, 1], got {fraction}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"engine {name!r}: kv_cache_dtype must be one of {sorted(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}"
            )
        self.name = name
        self._model = model.eval()
        self._spec = spec
        self._device = next(model.parameters()).device
        self._max_seq_len = min(max_seq_len or spec.max_position_embeddings, spec.max_position_embeddings)
        graphs = self._device.type == "cuda" if cuda_graphs is None else cuda_graphs
        if graphs and self._device.type != "cuda":
            raise ValueError(f"engine {name!r}: cuda_graphs needs a model on a CUDA device, not {self._device}")
        self._vision = vision_of(model)
        language = language_model_of(model)
        self._batch = ContinuousBatch(
            CachedForward(
                language,
                self._max_seq_len,
                flash_decode=flash_decode,
                fused_decode=fused_decode,
                kv_cache_dtype=KV_CACHE_DTYPES[kv_cache_dtype],
            ),
            list(model.parameters()),
            max_rows=max_batch_size,
            max_seq_len=self._max_seq_len,
            vocab_size=spec.vocab_size,
            prefill_tokens=prefill_chunk_tokens,
            cuda_graphs=graphs,
            memory_fraction=kv_cache_memory_fraction,
            kv_layout=kv_cache_layout,
            kv_blocks=kv_cache_blocks,
            embed_prompt=self._prompt_embeddings if self._vision is not None else None,
            mask_logits=None if self._vision is None else partial(never_predict, token_id=self._vision.image_token_id),
        )
        eos = {eos_token_id} if stop_on_eos and eos_token_id is not None else set()
        self._extra_stop_ids = frozenset(int(t) for t in extra_stop_token_ids)  # what a request ignoring eos keeps
        self._stop_ids = frozenset(eos) | self._extra_stop_ids
        self._seeds = random.Random(seed)
        self._clock = ActiveClock()
        self._ids = itertools.count()
        self._worker = DecodeWorker(self._model, spec, self._batch, name=name, version=weight_version)

    @classmethod
    def from_pretrained(
        cls,
        model_name: str,
        *,
        precision: str = "fp32",
        seed: int = 0,
        tokenizer_name: str | None = None,
        device: str | torch.device = "cpu",
        **kwargs: Any,
    ) -> MegatronEngine:
        """An engine on a fresh replica of ``model_name`` (``"builtin:<name>"`` or an HF directory/id, as the trainer).

        Builds the model on ``device`` with :func:`~sc_lightning.models.megatron.load_policy` (same ``precision`` and
        ``seed`` give the trainer's initial weights) and takes the tokenizer's eos as stop token; ``kwargs`` go to
        the constructor.
        """
        model, spec, tokenizer = load_policy(
            model_name, precision=precision, seed=seed, tokenizer_name=tokenizer_name, device=device
        )
        kwargs.setdefault("seed", seed)
        return cls(model, spec, eos_token_id=tokenizer.eos_token_id, **kwargs)

    @classmethod
    def from_spec(
        cls,
        model_name: str,
        spec: ModelSpec,
        *,
        eos_token_id: int | None,
        precision: str = "fp32",
        seed: int = 0,
        device: str | torch.device = "cpu",
        **kwargs: Any,
    ) -> MegatronEngine:
        """An engine on a fresh replica of ``model_name`` whose architecture ``spec`` and stop token the caller read.

        The replica equals :meth:`from_pretrained`'s (same weights for the same ``precision`` and ``seed``), but no
        config or tokenizer is read: an engine actor is handed both by the driver that read them.
        """
        model = build_policy(model_name, spec, precision=precision, seed=seed, device=device)
        kwargs.setdefault("seed", seed)
        return cls(model, spec, eos_token_id=eos_token_id, **kwargs)

    @classmethod
    def from_policy_config(cls, policy: Any, *, seed: int = 0, **kwargs: Any) -> MegatronEngine:
        """An engine for a ``PolicyConfig`` section: its model, tokenizer, precision and sequence-length limit."""
        kwargs.setdefault("max_seq_len", policy.max_total_sequence_length)
        return cls.from_pretrained(
            policy.model_name, precision=policy.precision, seed=seed, tokenizer_name=policy.tokenizer_name, **kwargs
        )

    @property
    def weight_version(self) -> int:
        """Version of the weights currently loaded."""
        return self._worker.version

    @property
    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters."""
        return dataclasses.replace(self._worker.stats)

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """The tokens that end every completion of this engine."""
        return self._stop_ids

    @property
    def max_seq_len(self) -> int:
        """The longest prompt + completion the engine serves."""
        return self._max_seq_len

    @property
    def stood_down(self) -> bool:
        """Whether the engine is stood down (between ``stand_down()`` and ``wake()``)."""
        return not self._clock.running

    @property
    def active_clock(self) -> ActiveClock:
        """The clock of this engine's awake time (stopped while stood down)."""
        return self._clock

    def active_deadline(self, seconds: float | None) -> contextlib.AbstractAsyncContextManager[None]:
        """``asyncio.timeout(seconds)`` counting only the time the engine is awake (raises ``TimeoutError``)."""
        return self._clock.deadline(seconds)

    async def active_wait_for(self, awaitable: Awaitable[T], timeout: float | None) -> T:
        """``asyncio.wait_for(awaitable, timeout)`` counting only the time the engine is awake."""
        return await self._clock.wait_for(awaitable, timeout)

    def _fail(self, rid: str, message: str) -> EngineError:
        """An EngineError naming this engine and request ``rid``."""
        return request_error(self.name, rid, message)

    def _prompt_embeddings(self, request: Request) -> torch.Tensor:
        """The merged embeddings ``(P, h)`` of an image prompt (on the worker thread, current weights)."""
        ids = torch.tensor([request.prompt], dtype=torch.long, device=self._device)
        return merged_embeddings(self._model, ids, None, [request.images])[:, 0]

    def _check_images(self, rid: str, prompt: tuple[int, ...], images: torch.Tensor | None) -> None:
        """Raise EngineError when ``images`` do not fit the prompt's ``<image>`` runs (or the model has no vision)."""
        vision = self._vision
        if vision is None:
            if images is not None:
                raise self._fail(rid, "images given, but the engine's model is a text model")
            return
        count = 0 if images is None else images.shape[0]
        shape = (vision.image_size, vision.image_size, 3)
        if images is not None and (images.dim() != 4 or tuple(images.shape[1:]) != shape):
            raise self._fail(rid, f"images must be uint8 (N, {', '.join(map(str, shape))}), got {tuple(images.shape)}")
        found = sum(t == vision.image_token_id for t in prompt)
        if found != count * vision.tokens_per_image:
            raise self._fail(
                rid,
                f"the prompt holds {found} <image> ids but {count} image(s) of {vision.tokens_per_image} tokens each",
            )
        if prompt[-1] == vision.image_token_id:
            raise self._fail(rid, "the prompt ends with an <image> token; a prompt must end with text after its images")

    def _check(self, rid: str, prompt: tuple[int, ...], sampling: SamplingParams) -> None:
        """Raise EngineError when the engine is shut down or the request cannot be served."""
        vocab = self._spec.vocab_size
        if self._worker.closed:
            raise self._fail(rid, "the engine is shut down")
        if not prompt:
            raise self._fail(rid, "empty prompt")
        if len(prompt) >= self._max_seq_len:
            raise self._fail(rid, f"prompt of {len(prompt)} tokens does not fit the {self._max_seq_len}-token context")
        if any(not 0 <= t < vocab for t in prompt):
            raise self._fail(rid, f"prompt has token ids outside the vocabulary [0, {vocab})")
        if sampling.max_new_tokens < 0 or sampling.temperature < 0 or (sampling.top_k or 0) < 0:
            raise self._fail(rid, f"invalid sampling settings {sampling}")
        if not 0 < sampling.top_p <= 1:
            raise self._fail(rid, f"top_p must be in (0, 1], got {sampling.top_p}")

    async def generate(
        self,
        prompt_token_ids: tuple[int, ...],
        sampling: SamplingParams,
        *,
        stop_token_ids: Iterable[int] = (),
        images: torch.Tensor | None = None,
    ) -> Generation:
        """Sample one completion of the prompt (``stop_token_ids`` add to the engine's stop tokens for this call; with
        ``sampling.ignore_eos`` the eos token is not one of them). ``images``: the prompt's images, uint8
        ``(N, H, W, 3)``, one per run of ``<image>`` ids (a vision-language model; None: a text prompt)."""
        rid = f"req-{next(self._ids)}"
        prompt = tuple(int(t) for t in prompt_token_ids)
        self._check(rid, prompt, sampling)
        self._check_images(rid, prompt, images)
        if sampling.max_new_tokens == 0:
            return Generation((), (), "length", self._worker.version)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Generation] = loop.create_future()
        stops = (self._extra_stop_ids if sampling.ignore_eos else self._stop_ids) | {int(t) for t in stop_token_ids}
        noise = noise_stream(sampling, self._seeds, self._device, self._spec.vocab_size)
        pixels = None if images is None or not len(images) else images.to(self._device)
        request = Request(rid, prompt, sampling, stops, noise, replier(loop, future), images=pixels)
        if not self._worker.submit(request):
            raise self._fail(rid, "the engine is shut down")
        try:
            return await future
        except asyncio.CancelledError:
            request.cancelled.set()  # the worker drops it at its next step
            raise

    async def _command(self, kind: CommandKind, **fields: Any) -> None:
        """Send a command to the worker thread and wait until it was applied (its error is raised here)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        if not self._worker.send(Command(kind, replier(loop, future), **fields)):
            raise EngineError(f"engine {self.name!r}: the engine is shut down ({kind} refused)")
        await future

    @property
    def device(self) -> torch.device:
        """The device the replica and its KV cache are on."""
        return self._device

    async def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load a full set of weights (or the last bucket after :meth:`stage_weights`: the set must then be complete)
        between two decode steps and adopt ``version``."""
        if self._worker.closed:
            raise EngineError(f"engine {self.name!r}: the engine is shut down (update to version {version} refused)")
        await self._command("update", named_tensors=named_tensors, version=version)

    async def stage_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load one bucket of ``version``'s HF-named weights, more to follow: decoding holds (no token comes from a
        half-loaded model) and ``weight_version`` stays until the :meth:`update_weights` with the last bucket."""
        if self._worker.closed:
            raise EngineError(f"engine {self.name!r}: the engine is shut down (stage of version {version} refused)")
        await self._command("stage", named_tensors=named_tensors, version=version)

    async def stand_down(self) -> None:
        """Pause decoding after the current step, free the KV cache and stop the active clock (idempotent)."""
        self._clock.pause()
        if not self._worker.closed:
            await self._command("stand_down")

    async def wake(self) -> None:
        """Resume decoding (paused requests are re-prefilled) and restart the active clock (idempotent)."""
        if not self._worker.closed:
            await self._command("wake")
        self._clock.resume()

    async def shutdown(self) -> None:
        """Abort the requests still held (``finish_reason="abort"``), stop the worker thread; idempotent."""
        if not self._worker.close():
            return
        with contextlib.suppress(EngineError):
            await self._command("shutdown")
        await self._worker.join()
