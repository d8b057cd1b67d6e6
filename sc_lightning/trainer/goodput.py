"""The trainer's goodput parts, and what both fleets' accounts say about balancing them.

Lightning-free, so the end-of-fit callback (:mod:`sc_lightning.callbacks.goodput`) and ``report`` (from the logged
totals) give the same advice.
"""

from __future__ import annotations

from sc_lightning.controller.api import EngineTime

TRAINER_PARTS = ("productive", "wait_rollouts", "refit", "checkpoint", "other")
"""The trainer's time parts, in the order they are logged."""


def allocation_advice(
    trainer: dict[str, float], engine: EngineTime, steps: int, devices: tuple[int, int] | None = None
) -> str:
    """A few lines on where each fleet's time went over ``steps`` RL steps, and the generation:training split and
    lookahead that would have balanced the two pumps (``devices``: the (generation, training) device counts)."""
    trainer_wall = sum(trainer.values()) or 1.0
    engine_wall = engine.wall_s or 1.0
    shares = ", ".join(f"{part} {seconds / trainer_wall:.0%}" for part, seconds in trainer.items())
    engine_shares = ", ".join(f"{part} {seconds / engine_wall:.0%}" for part, seconds in engine.parts().items())
    lines = [
        f"goodput over {steps} steps: trainer {trainer_wall:.1f} s ({shares})",
        f"  engines {engine_wall:.1f} s ({engine_shares}); {engine.trained_tokens} tokens trained, "
        f"{engine.wasted_tokens} wasted",
    ]
    generating = (engine.trained_s + engine.wasted_s + engine.pending_s) / steps  # engine-seconds a step needed
    training = (trainer_wall - trainer["wait_rollouts"]) / steps
    balance = f"  advice: per step generation kept the engines busy {generating:.2f} s, training took {training:.2f} s"
    if devices is not None and generating > 0 and training > 0:
        generation_devices, training_devices = devices
        total = generation_devices + training_devices
        need = generating * generation_devices / (generating * generation_devices + training * training_devices)
        given = max(1, min(total - 1, round(need * total)))
        balance += f"; of the {total} devices, about {given} for generation and {total - given} for training"
    elif training > 0:
        balance += f"; generation would keep pace with training on about {generating / training:.2f}x its devices"
    waited, idle = trainer["wait_rollouts"] / trainer_wall, engine.idle_s / engine_wall
    if waited > 0.05 and idle > 0.05:
        gate = "the engines idled while the trainer waited: admission held generation back, so allow one more "
        gate += "version of lookahead (async_rl.sampler's max_lookahead_versions or max_staleness_versions) or "
        gate += "raise async_rl.max_buffered_rollouts / max_inflight_prompts"
    elif waited > 0.05:
        gate = f"the trainer waited {waited:.0%} of its time on busy engines: more generation devices, not lookahead"
    else:
        gate = "the trainer barely waited: the lookahead in use suffices"
    lines += [balance, f"  {gate}"]
    return "\n".join(lines)
