"""Sampler classes that declare (or fail to declare) capabilities, for the custom-sampler config rules."""


class CapableSampler:
    """Declares both capabilities as plain booleans."""

    supports_buffer_checkpoint = True
    supports_training_claims = True


class NoCheckpointSampler:
    """Declares nothing, so it supports neither buffer checkpoints nor training claims."""


class ClaimlessSampler:
    """Supports buffer checkpoints but not training claims."""

    supports_buffer_checkpoint = True


class PropertyFlagSampler:
    """Declares a capability as a property, which cannot be read without building the sampler."""

    @property
    def supports_buffer_checkpoint(self) -> bool:
        """Not a class attribute."""
        return True


NOT_A_CLASS = 3
