"""Run directories as fit leaves them: the length of the report tests' real run, and a Lightning CSV logger's
versions written by hand."""

from __future__ import annotations

from pathlib import Path

TINY_RUN_STEPS = 6  # the steps of the real tiny run the report tests share (tests/report/conftest.py)


def write_version(run_dir: Path, number: int, text: str) -> None:
    """Write ``text`` as the metrics.csv of ``run_dir``'s lightning_logs/version_``number``."""
    path = run_dir / "lightning_logs" / f"version_{number}" / "metrics.csv"
    path.parent.mkdir(parents=True)
    path.write_text(text)
