"""``import_class``: the class a ``"package.module:ClassName"`` string names (custom samplers, environments)."""

from __future__ import annotations

import importlib


def import_class(target: str) -> type:
    """Import the class named by ``"module:ClassName"``; ValueError says what is wrong with ``target``."""
    module_name, sep, class_name = target.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f'must look like "package.module:ClassName", got {target!r}')
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise ValueError(f"{class_name!r} in module {module_name!r} is not a class")
    return cls
