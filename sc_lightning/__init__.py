"""sc_lightning: asynchronous GRPO/PPO post-training of LLMs on the Single-Controller model, for Lightning.

Importing the package is cheap: only the config layer loads here. The Lightning surface (strategy, modules,
callbacks, engine factory) is importable from the root too, and loads lazily on first use, with Lightning,
megatron-core and Ray behind it::

    from sc_lightning import GRPOModule, RefitCallback, SingleControllerStrategy
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sc_lightning.config import (
    ConfigError,
    SCConfig,
    load_config,
    validate_single_controller_config,
)

if TYPE_CHECKING:
    from sc_lightning.callbacks.checkpoint import BundleCheckpoint
    from sc_lightning.callbacks.monitor import RolloutMonitor
    from sc_lightning.callbacks.refit import RefitCallback
    from sc_lightning.config.yaml_io import load_yaml_layers
    from sc_lightning.engines.factory import default_engine_factory
    from sc_lightning.lightning.module import GRPOModule
    from sc_lightning.lightning.ppo_module import PPOModule
    from sc_lightning.lightning.strategy import SingleControllerStrategy

_LAZY = {
    "BundleCheckpoint": "sc_lightning.callbacks.checkpoint",
    "GRPOModule": "sc_lightning.lightning.module",
    "PPOModule": "sc_lightning.lightning.ppo_module",
    "RefitCallback": "sc_lightning.callbacks.refit",
    "RolloutMonitor": "sc_lightning.callbacks.monitor",
    "SingleControllerStrategy": "sc_lightning.lightning.strategy",
    "default_engine_factory": "sc_lightning.engines.factory",
    "load_yaml_layers": "sc_lightning.config.yaml_io",
}
"""Public name -> the module that defines it, imported on first access."""

__all__ = [
    "BundleCheckpoint",
    "ConfigError",
    "GRPOModule",
    "PPOModule",
    "RefitCallback",
    "RolloutMonitor",
    "SCConfig",
    "SingleControllerStrategy",
    "default_engine_factory",
    "load_config",
    "load_yaml_layers",
    "validate_single_controller_config",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import a lazily exported name from its module on first access."""
    if name not in _LAZY:
        raise AttributeError(f"module 'sc_lightning' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
