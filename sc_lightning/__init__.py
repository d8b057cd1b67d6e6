"""sc_lightning: asynchronous GRPO/PPO post-training of LLMs on the Single-Controller model, for Lightning.

Importing the package is cheap: only the config layer loads here; engines, Ray and megatron-core load lazily
where they are used.
"""

from sc_lightning.config import (
    ConfigError,
    SCConfig,
    load_config,
    validate_single_controller_config,
)

__all__ = ["ConfigError", "SCConfig", "load_config", "validate_single_controller_config"]
__version__ = "0.1.0"
