"""Reading config layers: YAML files deep-merged in order, dotted overrides on top, ``${…}`` resolved."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sc_lightning.config.knobs import ConfigError, ConfigIssue


def load_yaml_layers(paths: Sequence[str | Path], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Merge the YAML files in order, apply ``a.b.c=value`` overrides, resolve ``${…}``; a plain dict out.

    Mappings merge key by key, except that a mapping whose ``name`` changes (a sampler mode, an advantage
    estimator) is replaced whole: the old mode's knobs would be errors under the new one.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    merged: dict[str, Any] = {}
    for path in paths:
        merge_into(merged, read_yaml_file(path))
    for override in overrides:
        apply_override(merged, override)
    try:
        data = OmegaConf.to_container(OmegaConf.create(merged), resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError([ConfigIssue(_omegaconf_path(exc), _first_line(exc))]) from None
    return data if isinstance(data, dict) else {}


def merge_into(base: dict[str, Any], layer: Mapping[str, Any]) -> None:
    """Deep-merge ``layer`` into ``base`` in place (a mapping whose ``name`` changes is replaced whole)."""
    for key, value in layer.items():
        old = base.get(key)
        if isinstance(old, dict) and isinstance(value, Mapping) and not _switches_variant(old, value):
            merge_into(old, value)
        else:
            base[key] = copy.deepcopy(value)


def apply_override(base: dict[str, Any], override: str) -> None:
    """Set one ``a.b.c=value`` override (value read as YAML); setting a new ``name`` resets that mapping."""
    dotpath, sep, text = override.partition("=")
    keys = dotpath.split(".")
    if not sep or not all(keys):
        raise ConfigError([ConfigIssue(dotpath, f"override {override!r} must look like --a.b.c=value")])
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([ConfigIssue(dotpath, f"override value {text!r} is not valid YAML: {exc}")]) from None
    *parents, leaf = keys
    node = base
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    if leaf == "name" and node.get("name") != value:
        node.clear()
    node[leaf] = value


def _switches_variant(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return "name" in new and old.get("name") != new["name"]


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key that a mapping holds twice (plain YAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """The mapping, once no key of its own repeats (keys merged in with ``<<`` may be overridden)."""
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                line = first_line.setdefault(key, key_node.start_mark.line)
            except TypeError:
                continue  # an unhashable key: the safe loader itself refuses it
            if line != key_node.start_mark.line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"found the key {key!r} twice (first on line {line + 1})", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


def read_yaml_file(path: str | Path) -> dict[str, Any]:
    """One YAML file as a mapping; a missing or unreadable file, bad YAML (a key twice included) or a non-mapping top
    level is a ConfigError."""
    path = Path(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # a safe loader
    except FileNotFoundError:
        raise ConfigError([ConfigIssue("", f"config file {str(path)!r} does not exist")]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigIssue("", f"config file {str(path)!r} is not UTF-8 text: {exc}")]) from None
    except OSError as exc:
        raise ConfigError([ConfigIssue("", f"config file {str(path)!r} cannot be read: {exc.strerror}")]) from None
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
