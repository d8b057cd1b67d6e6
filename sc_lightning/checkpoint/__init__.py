"""Checkpoints and recovery: the bootstrap fingerprint (bundles, snapshots and ledgers arrive with issue 7)."""
