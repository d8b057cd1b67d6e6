"""The Single-Controller: replay buffer, staleness samplers, rollout pump and the train-side API (no Lightning)."""
