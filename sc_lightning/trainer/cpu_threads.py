"""How many threads a CPU trainer's torch ops use: the cores its generation engines leave it.

torch starts one intra-op thread per core. A CPU trainer whose engines run in their own Ray actors on the same
machine (each reserves one CPU and runs one thread) then asks for more cores than there are: its extra threads
spin in OpenMP's barriers while the engine waits for a core. On the 2-core box (configs/grpo_tiny.yaml, 300 steps,
2026-12-05) the trainer's own compute took 0.10-0.11 s a step with 2 threads or 1, but with 1 the engine was busy
0.09 s a step instead of 0.12 s and the run's 300 steps took 36.4 s of trainer time instead of 40.6 s.

The rule: ``(cores - engine actors' CPUs) // trainer ranks on this machine`` threads, at least one. It applies only
when the user has not chosen: ``OMP_NUM_THREADS`` set in the environment wins.
"""

from __future__ import annotations

import os

import torch

USER_THREADS_VARIABLE = "OMP_NUM_THREADS"


def cpu_training_threads(cores: int, engine_cpus: int, ranks_here: int) -> int:
    """Intra-op threads for each of ``ranks_here`` CPU trainer ranks sharing ``cores`` with engines that reserve
    ``engine_cpus`` of them; at least one."""
    return max(1, (cores - engine_cpus) // max(1, ranks_here))


def share_cores_with_engines(cores: int, engine_cpus: int, ranks_here: int) -> int:
    """Set this CPU trainer process's torch threads by :func:`cpu_training_threads` (unless ``OMP_NUM_THREADS``
    is set); the thread count torch uses afterwards."""
    if not os.environ.get(USER_THREADS_VARIABLE):
        torch.set_num_threads(cpu_training_threads(cores, engine_cpus, ranks_here))
    return torch.get_num_threads()
