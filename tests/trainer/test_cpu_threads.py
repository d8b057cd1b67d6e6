"""A CPU trainer's torch threads: the cores its engines' actors leave it, unless the user chose (OMP_NUM_THREADS)."""

from __future__ import annotations

import pytest
import torch

from sc_lightning.trainer.cpu_threads import cpu_training_threads, share_cores_with_engines


@pytest.mark.parametrize(
    ("cores", "engine_cpus", "ranks", "threads"),
    [
        (2, 1, 1, 1),  # the 2-core box with the engine in its own actor
        (2, 0, 1, 2),  # colocated: the engine shares the trainer's threads
        (16, 1, 2, 7),  # two ranks share what the engine leaves
        (2, 4, 1, 1),  # more engines than cores: still one thread
        (4, 1, 8, 1),
    ],
)
def test_the_trainer_takes_the_cores_the_engines_leave_split_over_its_ranks(
    cores: int, engine_cpus: int, ranks: int, threads: int
) -> None:
    assert cpu_training_threads(cores, engine_cpus, ranks) == threads


def test_the_thread_count_is_set_unless_omp_num_threads_names_one(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert share_cores_with_engines(3, 1, 1) == 2 == torch.get_num_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        torch.set_num_threads(1)
        assert share_cores_with_engines(3, 1, 1) == 1  # the user's choice, applied by torch at start, stays
    finally:
        torch.set_num_threads(before)
