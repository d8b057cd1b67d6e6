"""Where the trainer's models live: the device Lightning's accelerator names, never one picked behind its back.

``trainer.accelerator: cpu`` trains on the CPU even on a machine with GPUs; ``gpu``/``cuda`` trains on this rank's
GPU (``LOCAL_RANK``, 0 for a single process); ``auto`` is whatever Lightning resolved it to. The policy, critic,
reference model and a colocated engine are all built on this device, and each step's batches are moved to it.
"""

from __future__ import annotations

import os

import torch
from lightning.pytorch.accelerators import Accelerator, CPUAccelerator, CUDAAccelerator
from lightning.pytorch.utilities.exceptions import MisconfigurationException


def training_device(accelerator: Accelerator | None, *, local_rank: int | None = None) -> torch.device:
    """The device for ``accelerator``: the CPU, or ``cuda:<local_rank>`` (default: the ``LOCAL_RANK`` variable)."""
    if isinstance(accelerator, CUDAAccelerator):
        rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
        return torch.device("cuda", rank)
    if isinstance(accelerator, CPUAccelerator):
        return torch.device("cpu")
    raise MisconfigurationException(
        f"sc_lightning trains on the CPU or on CUDA GPUs, not with {type(accelerator).__name__}: "
        "set trainer.accelerator to cpu, gpu or auto"
    )
