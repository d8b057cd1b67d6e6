"""Use sc_lightning from a plain Lightning script, without the CLI.

    python examples/lightning_dropin.py            # trains the tiny arithmetic policy for 200 RL steps on CPU

The pieces: a validated config, a generation engine factory, the Single-Controller strategy (starts the data
plane, the engine and the controller's rollout pump), the refit callback (pushes new weights to the engine after
every RL step), the rollout monitor (logs the refit, step times and rollout counters) and the GRPO module. Any
Lightning logger or callback can be added as usual.
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger

from sc_lightning import (
    GRPOModule,
    RefitCallback,
    RolloutMonitor,
    SingleControllerStrategy,
    default_engine_factory,
    load_config,
    load_yaml_layers,
    validate_single_controller_config,
)

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "grpo_tiny.yaml"


def main() -> None:
    """Train the tiny policy for 200 RL steps with the in-process data plane."""
    raw = load_yaml_layers([CONFIG], ["grpo.max_num_steps=200", "data_plane.backend=memory"])
    config = load_config(raw, extra_top_level=("trainer", "seed_everything"))
    validate_single_controller_config(config)
    trainer = Trainer(
        strategy=SingleControllerStrategy(config, default_engine_factory),
        callbacks=[RefitCallback(), RolloutMonitor()],
        logger=CSVLogger("lightning_logs", name="dropin"),
        max_steps=config.algo.max_num_steps,
        log_every_n_steps=10,
    )
    trainer.fit(GRPOModule(config))
    print(f"trained {trainer.global_step} RL steps; last reward {float(trainer.callback_metrics['train/reward']):.3f}")


if __name__ == "__main__":
    main()
