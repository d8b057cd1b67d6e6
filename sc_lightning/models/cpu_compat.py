"""The minimum patches that let megatron-core 0.16.1 build, run and train a ``GPTModel`` on a machine without CUDA.

:func:`apply_cpu_compat` installs them once per process; ``init_model_parallel`` calls it for a CPU device, also
on a machine that has CUDA (a CPU run must not touch the GPU), and never for a CUDA one. Together with the SDPA
core attention of :mod:`sc_lightning.models.attention` (used on GPUs too), a ``GPTModel`` built with
``use_cpu_initialization=True`` then runs forward/backward at TP=1 and TP>1 over gloo, including activation
recomputation. What is patched, and why (paths relative to ``megatron/core``):

1. ``RotaryEmbedding.get_emb`` (``models/common/embeddings/rotary_pos_embedding.py:160``) moves ``inv_freq`` to
   ``torch.cuda.current_device()`` on the first forward. The replacement computes the same table on the device
   ``inv_freq`` already lives on.
2. The model-parallel RNG tracker (``tensor_parallel/random.py``) keeps CUDA generator states; on a CPU-only torch
   any ``fork()``/``add()`` raises "Torch not compiled with CUDA enabled". :class:`CPURNGStatesTracker` keeps CPU
   generator states instead, and the module-level ``_get_cuda_rng_state``/``_set_cuda_rng_state`` used by
   activation recomputation (``CheckpointFunction``) read and write the CPU generator.

3. megatron's ``DistributedDataParallel`` allocates its gradient buffers on ``torch.cuda.current_device()``
   (``distributed/param_and_grad_buffer.py:806``), and ``dist_checkpointing`` synchronises the GPU after copying
   tensors to the host and broadcasts its failure flag from a CUDA tensor
   (``dist_checkpointing/strategies/filesystem_async.py:230``, ``state_dict_saver.py:252``).
   megatron's pipeline schedule counts tokens in ``torch.zeros(..., device="cuda")``
   (``pipeline_parallel/schedules.py:2138``) and its point-to-point shape exchange allocates on the current device.
   :func:`cuda_calls_on` points ``torch.cuda.current_device`` at the model's device, makes
   ``torch.cuda.synchronize`` a no-op and sends tensors created with ``device="cuda"`` to the model's device while
   those run (with ``overlap_grad_reduce`` off nothing else in the DDP touches CUDA).

   megatron's distributed optimizer accepts only parameters whose ``Tensor.type()`` names a CUDA type
   (``optimizer/distrib_optimizer.py:361,420``) and stages its checkpoint gathers through ``Tensor.cuda()``
   (``:1089``): under :func:`cuda_calls_on` a CPU tensor's ``type()`` reads as its CUDA twin and ``.cuda()``
   stays on the model's device, so an fp32 model builds, steps and checkpoints the distributed optimizer on CPUs.

Not covered: megatron's mixed-precision (bf16) optimizer and the inference engines, which need a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from megatron.core.models.common.embeddings import rotary_pos_embedding
from megatron.core.tensor_parallel import random as mc_random
from torch.overrides import TorchFunctionMode

_MODEL_PARALLEL_RNG = "model-parallel-rng"
_DEFAULT_RNG = "default-rng"


class CPURNGStatesTracker(mc_random.CudaRNGStatesTracker):
    """megatron's named RNG-state tracker, keeping CPU generator states instead of CUDA ones.

    ``add(name, seed)`` records the CPU generator state seeded with ``seed``; ``fork(name)`` swaps that state in
    for the duration of the block and stores the advanced state back on exit.
    """

    def __init__(self) -> None:
        super().__init__(use_cudagraphable_rng=False, is_inference_rng_tracker=False)

    def add(self, name: str, seed: int) -> None:
        """Track a new CPU RNG state called ``name``, seeded with ``seed`` (both must be new)."""
        self._is_initialized = True
        if seed in self.seeds_:
            raise ValueError(f"RNG seed {seed} is already tracked")
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} is already tracked")
        self.seeds_.add(seed)
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Run the block with the CPU generator set to the tracked state ``name``, then restore the outer state."""
        if name not in self.states_:
            raise KeyError(f"RNG state {name!r} is not tracked; call add({name!r}, seed) first")
        outer_state, outer_name = torch.get_rng_state(), self._current_state_name
        if outer_name != _DEFAULT_RNG:
            self.states_[outer_name] = outer_state
        torch.set_rng_state(self.states_[name])
        self._current_state_name = name
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(self.states_[outer_name] if outer_name != _DEFAULT_RNG else outer_state)
            self._current_state_name = outer_name


def _rope_get_emb(self: rotary_pos_embedding.RotaryEmbedding, max_seq_len: int, offset: int = 0) -> torch.Tensor:
    """``RotaryEmbedding.get_emb`` that keeps ``inv_freq`` where it is (no move to a CUDA device)."""
    freqs = self.get_freqs_non_repeated(max_seq_len, offset)  # (s, dim/2)
    if self.rotary_interleaved:
        emb = torch.stack((freqs, freqs), dim=-1).reshape(freqs.shape[0], -1)  # (s, dim): f0 f0 f1 f1 ...
    else:
        emb = torch.cat((freqs, freqs), dim=-1)  # (s, dim): f0 f1 ... f0 f1 ...
    return emb[:, None, None, :]  # (s, 1, 1, dim)


def _cpu_rng_state(device: object = None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    """CPU stand-in for megatron's ``_get_cuda_rng_state``."""
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: torch.Tensor, device: object = -1, graph_safe: bool = False) -> None:
    """CPU stand-in for megatron's ``_set_cuda_rng_state``."""
    torch.set_rng_state(new_state)


def apply_cpu_compat() -> None:
    """Install the CPU patches once (idempotent)."""
    if rotary_pos_embedding.RotaryEmbedding.get_emb is not _rope_get_emb:
        rotary_pos_embedding.RotaryEmbedding.get_emb = _rope_get_emb
    mc_random._get_cuda_rng_state = _cpu_rng_state
    mc_random._set_cuda_rng_state = _set_cpu_rng_state
    if not isinstance(mc_random._CUDA_RNG_STATE_TRACKER, CPURNGStatesTracker):
        mc_random._CUDA_RNG_STATE_TRACKER = CPURNGStatesTracker()
        mc_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


@contextlib.contextmanager
def cuda_calls_on(device: torch.device) -> Iterator[None]:
    """While megatron's DDP or optimizer is built or steps, or ``dist_checkpointing`` runs: its
    ``torch.cuda.current_device()`` is ``device``, ``torch.cuda.synchronize()`` does nothing, and CUDA tensor requests
    land on ``device`` (a CUDA device: nothing changes)."""
    if device.type == "cuda":
        yield
        return
    current_device, synchronize = torch.cuda.current_device, torch.cuda.synchronize
    torch.cuda.current_device = lambda: device  # type: ignore[assignment]
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    try:
        with _CudaTensorsOn(device):
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize = current_device, synchronize


class _CudaTensorsOn(TorchFunctionMode):
    """Tensors created with ``device="cuda"`` (or a CUDA ``torch.device``) or moved by ``.cuda()`` go to ``device``
    instead, and ``Tensor.type()`` names the CUDA type of a tensor's dtype (megatron's optimizer checks for them)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's protocol
        kwargs = kwargs or {}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.cuda:
            return args[0].to(self.device)
        where = kwargs.get("device")
        if where is not None and torch.device(where).type == "cuda":
            kwargs = {**kwargs, "device": self.device}
        return func(*args, **kwargs)


def seed_cpu_rng_tracker(seed: int, tp_rank: int) -> None:
    """Seed the CPU generator and the tracker like ``model_parallel_cuda_manual_seed`` does on a GPU."""
    tracker = mc_random.get_cuda_rng_tracker()
    tracker.reset()
    torch.manual_seed(seed)
    tracker.add(mc_random.get_data_parallel_rng_tracker_name(), seed)
    tracker.add(_MODEL_PARALLEL_RNG, seed + 2718 + tp_rank)
    tracker.add(mc_random.get_expert_parallel_rng_tracker_name(), seed + 1024)
