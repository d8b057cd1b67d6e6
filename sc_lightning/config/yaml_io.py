"""Reading config layers: YAML files deep-merged in order, dotted overrides on top, ``${…}`` resolved."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from sc_lightning.config.knobs import ConfigError, ConfigIssue


def load_yaml_layers(paths: Sequence[str | Path], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Merge the YAML files in order, apply ``a.b.c=value`` overrides, resolve interpolations; plain dict out."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    layers = [OmegaConf.create(read_yaml_file(path)) for path in paths]
    try:
        layers.append(OmegaConf.from_dotlist(list(overrides)))
        merged = OmegaConf.merge(*layers) if layers else OmegaConf.create({})
        data = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError([ConfigIssue(_omegaconf_path(exc), _first_line(exc))]) from None
    return data if isinstance(data, dict) else {}


def read_yaml_file(path: str | Path) -> dict[str, Any]:
    """One YAML file as a mapping; a missing file, bad YAML or a non-mapping top level is a ConfigError."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError([ConfigIssue("", f"config file {str(path)!r} does not exist")]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigIssue("", f"config file {str(path)!r} is not valid YAML: {exc}")]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue("", f"config file {str(path)!r} must hold a mapping at top level")])
    return data


def _omegaconf_path(exc: Exception) -> str:
    return str(getattr(exc, "full_key", "") or "")


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
