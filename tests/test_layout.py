"""Package structure: the layout rules of design.md (checked by a function over a package directory, itself tested on
a synthetic tree), a cheap top-level import, and docstrings."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "sc_lightning"

# What each part may import from the package (design.md's arrows, plus engines -> models: the Megatron engine
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
    "trainer": {"trainer", "controller", "algorithms", "models", "data_plane", "config", "types", "tokenizer"},
    # the rollout side assembles everything below the Lightning adapter, and imports no Lightning (LIGHTNING_USERS)
    "rollout_side": {"rollout_side", "controller", "trainer", "rollout", "engines", "data_plane", "checkpoint"}
    | {"models", "config", "types", "tokenizer"},
}
# Of some allowed parts, a part may import only these modules.
ONLY_MODULES = {"trainer": {"controller": {"api"}, "data_plane": {"base"}}}
# The one port to the controller, and its composition surface: all that code outside controller/ may import of it.
CONTROLLER_SURFACE = {"api", "build"}
LIGHTNING_PACKAGES = {"lightning", "pytorch_lightning"}
LIGHTNING_USERS = {"lightning", "callbacks", "cli"}


@dataclass(frozen=True)
class Violation:
    """One import that breaks a layout rule: the file (relative to the package's parent), what it imports, the rule."""

    path: str
    module: str
    rule: str

    def __str__(self) -> str:
        return f"{self.path} imports {self.module}: {self.rule}"


def imported_modules(path: Path, package: Path) -> set[str]:
    """Dotted names ``path`` imports, relative imports resolved; ``from m import n`` counts as ``m.n``."""
    module = path.relative_to(package.parent).with_suffix("").parts
    here = module[:-1]  # the package a module (or an __init__) belongs to, for relative imports
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1]) if node.level else ""
            source = ".".join(part for part in (base, node.module or "") if part)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def layout_violations(package: Path) -> list[Violation]:
    """Every import under ``package`` that breaks a layout rule, in file order."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        part = rel.parts[0] if len(rel.parts) > 1 else rel.stem  # its folder, or the top-level module's name
        for module in sorted(imported_modules(path, package)):
            for rule in _broken_rules(part, module.split("."), package.name):
                found.append(Violation(str(path.relative_to(package.parent)), module, rule))
    return found


def _broken_rules(part: str, target: list[str], name: str) -> list[str]:
    if target[0] in LIGHTNING_PACKAGES:
        return [] if part in LIGHTNING_USERS else [f"only {sorted(LIGHTNING_USERS)} may import {target[0]}"]
    if target[0] != name or len(target) < 2:
        return []
    rules = []
    imported, submodule = target[1], target[2] if len(target) > 2 else None
    if imported == "testing" and part != "testing":
        rules.append("the package never imports its test support")
    if part in ALLOWED and imported not in ALLOWED[part]:
        rules.append(f"{part}/ may import only {sorted(ALLOWED[part])}")
    only = ONLY_MODULES.get(part, {}).get(imported)
    if only is not None and submodule not in only:
        rules.append(f"{part}/ may import only {sorted(only)} of {imported}/")
    if imported == "controller" and part != "controller" and submodule not in CONTROLLER_SURFACE:
        rules.append(f"outside controller/ only controller.{{{','.join(sorted(CONTROLLER_SURFACE))}}} may be imported")
    return rules


def test_the_package_keeps_its_layout() -> None:
    assert [str(v) for v in layout_violations(PACKAGE)] == []


def _write_tree(root: Path, files: dict[str, str]) -> Path:
    package = root / "sc_lightning"
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    for folder in {p.parent for p in package.rglob("*.py")}:
        (folder / "__init__.py").touch()
    return package


CLEAN_TREE = {
    "cli.py": "import lightning.pytorch\nfrom sc_lightning.controller.build import build_controller\n",
    "lightning/strategy.py": "from lightning.pytorch import Trainer\nfrom sc_lightning.controller import api, build\n",
    "callbacks/refit.py": "import pytorch_lightning\nfrom sc_lightning.controller.api import ControllerStats\n",
    "trainer/chunks.py": "import torch\nfrom sc_lightning.controller.api import GroupMeta\n"
    "from sc_lightning.data_plane.base import DataPlane\nfrom sc_lightning.algorithms import whiten\n"
    "from . import optim\nfrom .optim import adamw\n",
    "trainer/optim.py": "from sc_lightning.config.model import OptimizerConfig\n",
    "controller/runners.py": "from sc_lightning.controller.controller import SingleController\nfrom . import buffer\n",
    "models/warm_start.py": "from sc_lightning.models.spec import builtin_spec\nfrom sc_lightning.tokenizer import T\n",
    "testing/fake.py": "from sc_lightning.testing import helpers\n",
    "rollout_side/side.py": "from sc_lightning.controller.build import build_controller\n"
    "from sc_lightning.trainer.step_stream import RLStepStream\n"
    "from sc_lightning.checkpoint.bundle import CONTROLLER_FILE\n",
}
PLANTED = {  # file -> (its text, the rules it breaks, by the start of their message)
    "trainer/uses_lightning.py": ("import lightning\n", ["only ['callbacks', 'cli', 'lightning'] may import"]),
    "models/late_lightning.py": (
        "def f():\n    from pytorch_lightning import Trainer\n",
        ["only ['callbacks', 'cli', 'lightning'] may import"],
    ),
    "trainer/rollout.py": ("from sc_lightning.rollout.manager import RolloutManager\n", ["trainer/ may import only"]),
    "trainer/codec.py": ("from sc_lightning.data_plane.codec import pad_rows\n", ["trainer/ may import only ['base']"]),
    "trainer/package.py": ("from sc_lightning.data_plane import DataPlane\n", ["trainer/ may import only ['base']"]),
    "trainer/buffer.py": (
        "from sc_lightning.controller.buffer import TQReplayBuffer\n",
        ["trainer/ may import only ['api']", "outside controller/ only"],
    ),
    "lightning/runners.py": ("from sc_lightning.controller.runners import LocalController\n", ["outside controller/"]),
    "lightning/relative.py": ("from ..controller import runners\n", ["outside controller/ only"]),
    "callbacks/whole.py": ("import sc_lightning.controller\n", ["outside controller/ only"]),
    "callbacks/fake.py": ("from sc_lightning.testing.fakes import Fake\n", ["the package never imports its test"]),
    "rollout_side/hooks.py": ("from lightning.pytorch import Callback\n", ["only ['callbacks', 'cli', 'lightning']"]),
    "rollout_side/strategy.py": ("from sc_lightning.lightning.strategy import S\n", ["rollout_side/ may import only"]),
}


def test_the_checker_passes_a_clean_tree(tmp_path: Path) -> None:
    assert layout_violations(_write_tree(tmp_path, CLEAN_TREE)) == []


def test_the_checker_reports_each_planted_violation(tmp_path: Path) -> None:
    package = _write_tree(tmp_path, {**CLEAN_TREE, **{name: text for name, (text, _) in PLANTED.items()}})
    found: dict[str, list[str]] = {}
    for violation in layout_violations(package):
        found.setdefault(violation.path.removeprefix("sc_lightning/"), []).append(violation.rule)
    assert sorted(found) == sorted(PLANTED)
    for name, (_, expected) in PLANTED.items():
        assert len(found[name]) == len(expected), (name, found[name])
        for rule, start in zip(sorted(found[name]), sorted(expected), strict=True):
            assert rule.startswith(start), (name, rule)


@pytest.mark.parametrize(
    ("file", "text", "module"),
    [
        ("trainer/chunks.py", "from . import optim", "sc_lightning.trainer.optim"),
        ("trainer/__init__.py", "from .chunks import load", "sc_lightning.trainer.chunks.load"),
        ("lightning/strategy.py", "from ..controller.api import GroupMeta", "sc_lightning.controller.api.GroupMeta"),
        ("cli.py", "from .config import load", "sc_lightning.config.load"),
    ],
)
def test_relative_imports_resolve_to_package_modules(tmp_path: Path, file: str, text: str, module: str) -> None:
    package = _write_tree(tmp_path, {file: text + "\n"})
    assert imported_modules(package / file, package) == {module}


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
