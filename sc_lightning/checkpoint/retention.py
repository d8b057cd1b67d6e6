"""Bundle retention (``checkpointing.keep_top_k``): keep the best K bundles by ``metric_name``, and the newest.

Each bundle records its ranking value in ``ranking.json`` when it is written. Retention then removes the bundles
outside the best ``keep_top_k`` — never the newest one, which the next resume needs, and never a bundle ranked by
another metric (or by none), which this run cannot compare. A bundle is removed by renaming it to a temporary name
first, so a crash in the middle of the deletion leaves a temporary (swept at the next start), never a partial
bundle that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from sc_lightning.checkpoint.atomic import TEMPORARY_PREFIX, complete_bundles

RANKING_FILE = "ranking.json"


def write_ranking(directory: Path, metric_name: str, value: float) -> None:
    """Record the bundle's ranking value (``metric_name`` is ``train:<metric>`` or ``val:<metric>``)."""
    (directory / RANKING_FILE).write_text(json.dumps({"metric_name": metric_name, "value": value}))


def read_ranking(bundle: Path, metric_name: str) -> float | None:
    """The bundle's value of ``metric_name``, or None when it was ranked by another metric or not at all."""
    try:
        ranking = json.loads((bundle / RANKING_FILE).read_text())
    except (OSError, ValueError):
        return None
    return float(ranking["value"]) if ranking.get("metric_name") == metric_name else None


def bundles_beyond_top_k(
    checkpoint_dir: Path, *, keep_top_k: int, metric_name: str, higher_is_better: bool
) -> list[Path]:
    """The bundles retention removes: ranked by ``metric_name`` outside the best K, never the newest."""
    bundles = complete_bundles(checkpoint_dir)
    if not bundles:
        return []
    newest = bundles[-1][1]
    ranked = [(value, step, path) for step, path in bundles if (value := read_ranking(path, metric_name)) is not None]
    # best first; among equal values the newer bundle is better
    ranked.sort(key=lambda item: (item[0] if higher_is_better else -item[0], item[1]), reverse=True)
    return [path for _, _, path in ranked[keep_top_k:] if path != newest]


def remove_bundle(bundle: Path) -> None:
    """Delete a bundle crash-safely: rename it to a temporary name, then remove the tree."""
    doomed = bundle.parent / f"{TEMPORARY_PREFIX}removing_{bundle.name}_{uuid.uuid4().hex[:8]}"
    os.rename(bundle, doomed)
    shutil.rmtree(doomed, ignore_errors=True)
