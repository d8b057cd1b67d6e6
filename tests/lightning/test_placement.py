"""Placement follows the Trainer: the accelerator names the device, and a CPU run never touches a GPU."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator, MPSAccelerator
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from sc_lightning.lightning.placement import training_device
from sc_lightning.trainer.chunks import TrainChunk
from tests.helpers.cli import user_environment
from tests.helpers.configs import REPO


def test_the_accelerator_names_the_device() -> None:
    assert training_device(CPUAccelerator()) == torch.device("cpu")
    assert training_device(CUDAAccelerator(), local_rank=3) == torch.device("cuda", 3)
    with pytest.raises(MisconfigurationException, match="trainer.accelerator to cpu, gpu or auto"):
        training_device(MPSAccelerator())


def test_the_local_rank_picks_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert training_device(CUDAAccelerator()) == torch.device("cuda", 2)


def test_a_chunk_already_on_its_device_is_not_copied() -> None:
    chunk = TrainChunk(*(torch.zeros(2, 3) for _ in range(4)), torch.zeros(2), torch.zeros(2), ["a", "b"], [0, 0])
    assert chunk.to(torch.device("cpu")) is chunk


# Runs in its own process: torch is made to report a GPU, and every real CUDA call fails loudly.
CPU_RUN_ON_A_GPU_BOX = textwrap.dedent(
    """
    import torch

    def trap(name):
        def touched(*args, **kwargs):
            raise AssertionError(f"a CPU run touched CUDA: torch.cuda.{name}")
        return touched  # one function per name: torch.compile's rule map refuses a shared one

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    for name in ("_lazy_init", "set_device", "current_device", "synchronize", "init"):  # (empty_cache: no-op)
        setattr(torch.cuda, name, trap(name))

    from lightning.pytorch import Callback

    from sc_lightning.lightning.module import GRPOModule
    from tests.helpers.fits import tiny_trainer
    from tests.helpers.fits import megatron_engine_factory
    from tests.helpers.fits import tiny_config

    class Devices(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            engine = trainer.strategy.rollout_side.controller.controller.served.engine
            self.seen = {
                trainer.strategy.root_device.type,
                next(pl_module.policy.parameters()).device.type,
                next(engine._model.parameters()).device.type,
            }

    config = tiny_config("grpo.max_num_steps=2")
    devices = Devices()
    trainer = tiny_trainer(config, megatron_engine_factory, [devices], accelerator="cpu")
    trainer.fit(GRPOModule(config))
    assert trainer.global_step == 2 and devices.seen == {"cpu"}, devices.seen
    print("stayed on the CPU")
    """
)


@pytest.mark.slow  # a fit in a child process, about a minute on 2 cores
def test_a_cpu_run_on_a_machine_with_a_gpu_never_touches_it() -> None:
    env = user_environment()  # this process's port is taken
    done = subprocess.run(
        [sys.executable, "-c", CPU_RUN_ON_A_GPU_BOX], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "stayed on the CPU" in done.stdout, done.stderr[-3000:]
