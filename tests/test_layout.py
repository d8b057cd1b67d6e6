"""Package structure: the dependency direction of design.md, a cheap top-level import, and docstrings."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import REPO

PACKAGE = REPO / "sc_lightning"

# What each part may import from sc_lightning (design.md's arrows, plus engines -> models: the Megatron engine
# runs the policy's own model code). lightning/, callbacks/ and cli may import everything.
ALLOWED = {
    "config": {"config"},
    "data_plane": {"data_plane", "config", "types"},
    "models": {"models", "types", "tokenizer"},
    "algorithms": {"algorithms", "config"},
    "engines": {"engines", "models", "config", "types", "tokenizer"},
    "rollout": {"rollout", "engines", "data_plane", "config", "types", "tokenizer"},
    "controller": {"controller", "rollout", "engines", "data_plane", "config", "types", "tokenizer"},
    "checkpoint": {"checkpoint", "data_plane", "config", "types"},
}


def imported_packages(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sc_lightning."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[1] for a in node.names if a.name.startswith("sc_lightning."))
    return names


def test_dependency_direction() -> None:
    for folder, allowed in ALLOWED.items():
        for path in (PACKAGE / folder).rglob("*.py"):
            wrong = imported_packages(path) - allowed
            assert not wrong, f"{path.relative_to(REPO)} imports sc_lightning.{wrong}; allowed: {allowed}"


def test_the_package_never_imports_its_test_support() -> None:
    for path in PACKAGE.rglob("*.py"):
        if "testing" not in path.parts:
            assert "testing" not in imported_packages(path), f"{path.relative_to(REPO)} imports sc_lightning.testing"


def test_config_layer_never_imports_heavy_frameworks() -> None:
    for path in (PACKAGE / "config").rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        heavy = {m for m in modules if m.split(".")[0] in {"torch", "lightning", "ray", "megatron", "transfer_queue"}}
        assert not heavy, f"{path.relative_to(REPO)} imports {heavy}"


def test_top_level_import_is_cheap() -> None:
    code = (
        "import sys, sc_lightning; print(sorted(m for m in ('torch','lightning','ray','megatron') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_public_module_function_and_class_has_a_docstring() -> None:
    missing = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        if ast.get_docstring(tree) is None:
            missing.append(str(path.relative_to(REPO)))
        for node in ast.walk(tree):
            public = isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")
            if public and ast.get_docstring(node) is None:
                missing.append(f"{path.relative_to(REPO)}:{node.name}")
    assert not missing, missing
