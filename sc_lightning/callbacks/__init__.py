"""Lightning callbacks of sc_lightning: refit (weight sync to the engines), its monitor, bundle checkpoints."""
