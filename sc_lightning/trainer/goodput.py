"""The trainer's goodput parts, and what both fleets' accounts say about balancing them.

Lightning-free, so the end-of-fit callback (:mod:`sc_lightning.callbacks.goodput`) and ``report`` (from the logged
totals) give the same advice.
"""

from __future__ import annotations

from dataclasses import dataclass

from sc_lightning.controller.api import EngineTime

TRAINER_PARTS = ("productive", "wait_rollouts", "refit", "checkpoint", "other")
"""The trainer's time parts, in the order they are logged."""

NEGLIGIBLE = 0.05
LOOKAHEAD_KNOB = "async_rl.sampler.max_lookahead_versions"  # the default sampler's (in_order)
"""The share of a fleet's time below which the trainer's waiting, or the engines' idling, counts as none."""


def allocation_advice(
    trainer: dict[str, float],
    engine: EngineTime,
    steps: int,
    devices: tuple[int, int] | None = None,
    off_policy: bool | None = None,
    lookahead_knob: str = LOOKAHEAD_KNOB,
) -> str:
    """A few lines on where each fleet's time went over ``steps`` RL steps, and one verdict on what would have
    balanced the two pumps (``devices``: the (generation, training) device counts of separate fleets;
    ``off_policy``: whether the sampler let generation run ahead of the trainer, None when unknown;
    ``lookahead_knob``: the sampler's knob for that, named in the advice)."""
    trainer_wall = sum(trainer.values()) or 1.0
    engine_wall = engine.wall_s or 1.0
    shares = ", ".join(f"{part} {seconds / trainer_wall:.0%}" for part, seconds in trainer.items())
    engine_shares = ", ".join(f"{part} {seconds / engine_wall:.0%}" for part, seconds in engine.parts().items())
    generating = (engine.trained_s + engine.wasted_s + engine.pending_s) / steps  # engine-seconds a step needed
    training = (trainer_wall - trainer["wait_rollouts"]) / steps
    waited, idle = trainer["wait_rollouts"] / trainer_wall, engine.idle_s / engine_wall
    colocated = engine.stood_down_s > 0
    pace = Pace(generating, training, waited, idle, colocated, off_policy=off_policy, lookahead_knob=lookahead_knob)
    return "\n".join(
        [
            f"goodput over {steps} steps: trainer {trainer_wall:.1f} s ({shares})",
            f"  engines {engine_wall:.1f} s ({engine_shares}); {engine.trained_tokens} tokens trained, "
            f"{engine.wasted_tokens} wasted",
            f"  per step generation kept the engines busy {generating:.2f} s and training took {training:.2f} s; "
            f"the trainer waited {waited:.0%} of its time, the engines idled {idle:.0%} of theirs",
            f"  advice: {pace.verdict(devices)}",
        ]
    )


@dataclass(frozen=True)
class Pace:
    """Both pumps' pace over a run: per step, the engine-seconds generation needed (``generating``) and the
    trainer's seconds less its wait (``training``); the trainer's share of time spent waiting for rollouts
    (``waited``), the engines' share spent idle (``idle``), whether the engines stood down for each train step
    (``colocated``: both fleets on the same devices), and whether generation ran ahead of the trainer
    (``off_policy``: the sampler's lookahead, set with ``lookahead_knob``; None when unknown)."""

    generating: float
    training: float
    waited: float
    idle: float
    colocated: bool
    off_policy: bool | None = None
    lookahead_knob: str = LOOKAHEAD_KNOB

    def verdict(self, devices: tuple[int, int] | None = None) -> str:
        """One recommendation, from the first rule that holds: the trainer barely waited (the lookahead suffices);
        the fleets share the devices (colocated: they take turns, only separate devices overlap them); the engines
        idled while the trainer waited (admission held generation back: more lookahead); else generation is the
        bottleneck (more generation devices)."""
        if self.waited < NEGLIGIBLE:
            spare = "" if self.colocated else self._devices(devices, more=False)
            return "the trainer barely waited: generation keeps pace and the lookahead in use suffices" + spare
        if self.colocated:
            turns = (
                f"the trainer waited {self.waited:.0%} of its time: generation and training take turns on the same "
                "devices (colocated), so each step waits for its generation; "
            )
            separate = "generation on its own devices (policy.generation.colocated.enabled: false) would overlap them"
            if self.off_policy:
                return (
                    turns + "the lookahead in use already lets the next step's prompts fill the engine's batch through "
                    "a step's long tail, so only " + separate
                )
            unknown = ", if not on" if self.off_policy is None else ""
            return (
                turns + f"one step of lookahead ({self.lookahead_knob}: 1{unknown}) keeps the "
                "engine's batch full through a step's long tail with the next step's prompts, and " + separate
            )
        if self.idle >= NEGLIGIBLE:
            return (
                f"the trainer waited {self.waited:.0%} of its time while the engines idled: admission held "
                "generation back, so allow one more version of lookahead (async_rl.sampler's "
                "max_lookahead_versions or max_staleness_versions) or raise async_rl.max_buffered_rollouts / "
                "max_inflight_prompts"
            )
        return (
            f"the trainer waited {self.waited:.0%} of its time on busy engines: generation is the bottleneck, so "
            "more generation devices, not lookahead" + self._devices(devices, more=True)
        )

    def split(self, devices: tuple[int, int]) -> int:
        """Of all ``devices`` (generation, training), how many for generation would make both pumps take a step in
        the same time: ``G·d_g / (G·d_g + T·d_t)`` of them, at least one each (needs G > 0 and T > 0)."""
        generation, training = devices
        total = generation + training
        need = self.generating * generation / (self.generating * generation + self.training * training)
        return max(1, min(total - 1, round(need * total)))

    def _devices(self, devices: tuple[int, int] | None, *, more: bool) -> str:
        """What generation's devices would balance the pumps, said only when it points the verdict's way (``more``
        generation devices, or fewer that still keep pace)."""
        if self.generating <= 0 or self.training <= 0:
            return ""
        if devices is None:
            ratio = self.generating / self.training
            points = ratio > 1 if more else ratio < 1
            return f"; generation would keep pace on about {ratio:.2f}x its devices" if points else ""
        given, total = self.split(devices), sum(devices)
        points = given > devices[0] if more else given < devices[0]
        return (
            f"; of the {total} devices, about {given} for generation and {total - given} for training" if points else ""
        )
