"""Package structure: the layout rules of docs/architecture.md, "Who may import whom" (checked by a function over a
package directory, itself tested on a synthetic tree), a cheap top-level import, and docstrings."""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.configs import REPO

PACKAGE = REPO / "sc_lightning"

# What each part may import from the package (the dependency direction, plus engines -> models: the Megatron engine
# runs the policy's own model code). lightning/, callbacks/ and cli/ may import everything.
ALLOWED = {
    "config": {"config"},
    "data_plane": {"data_plane", "config", "types", "local_ray"},
    "models": {"models", "types", "tokenizer", "tasks"},
    "algorithms": {"algorithms", "config"},
    "engines": {"engines", "models", "config", "types", "tokenizer", "local_ray"},
    "rollout": {"rollout", "engines", "data_plane", "config", "types", "tokenizer", "tasks"},
    "tasks": {"tasks"},  # the synthetic tasks as text: what datasets and environments pose, warm starts teach
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
# The composition root: imported by nothing but itself and ``python -m sc_lightning``.
COMPOSITION_ROOT, ROOT_IMPORTERS = "cli", {"cli", "__main__"}


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
    if imported == COMPOSITION_ROOT and part not in ROOT_IMPORTERS:
        rules.append(f"{COMPOSITION_ROOT}/ is the composition root: only {sorted(ROOT_IMPORTERS)} import it")
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
    "__main__.py": "from sc_lightning.cli.main import main\n",
    "cli/main.py": "from sc_lightning.cli.fit import fit_command\n",
    "cli/fit.py": "import lightning.pytorch\nfrom sc_lightning.controller.build import build_controller\n",
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
    "lightning/cli_parser.py": ("from sc_lightning.cli.load import LIGHTNING_KEYS\n", ["cli/ is the composition root"]),
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


# Size, test-module and citation rules: a file a newcomer can read in one sitting, a Lightning adapter that stays
# thin, test helpers in helper modules, and docs that stand alone.
MAX_LINES = 450
"""The longest source file; a longer one says why in its module docstring, with LONG_FILE_REASON."""
LONG_FILE_REASON = "over 450 lines:"
"""How a module docstring states why its file is longer than MAX_LINES ("... over 450 lines: one state machine")."""
MAX_LIGHTNING_LINES = 800
"""All of lightning/ together: the adapter is thin; what has no Lightning in it lives elsewhere."""
OUTSIDE_DOCUMENTS = ("design.md", "notes/", "reference-semantics", "lightning-megatron", "spec/single-controller")
"""Documents outside the repository that no module may cite (cite docs/ instead)."""


def size_violations(package: Path) -> list[str]:
    """Source files over MAX_LINES without a stated reason, and lightning/ over MAX_LIGHTNING_LINES in all."""
    found = []
    for path in sorted(package.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        reason = LONG_FILE_REASON in (ast.get_docstring(ast.parse(path.read_text())) or "")
        if lines > MAX_LINES and not reason:
            found.append(f"{path.relative_to(package.parent)}: {lines} lines, no '{LONG_FILE_REASON}' reason")
    adapter = sum(len(p.read_text().splitlines()) for p in (package / "lightning").rglob("*.py"))
    if adapter > MAX_LIGHTNING_LINES:
        found.append(f"{package.name}/lightning/: {adapter} lines in all, over {MAX_LIGHTNING_LINES}")
    return found


def test_modules_import_no_test_module() -> None:
    """No module under tests/ imports a test module (``tests.....test_x``): shared helpers live in helper modules."""
    assert imports_of_test_modules(REPO / "tests") == []


def imports_of_test_modules(tests: Path) -> list[str]:
    """Each import of a test module (a ``test_*`` module) by another module under ``tests``."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        for module in sorted(imported_modules(path, tests)):
            if any(part.startswith("test_") for part in module.split(".")[1:]):
                found.append(f"{path.relative_to(tests.parent)} imports {module}")
    return found


def outside_citations(roots: list[Path]) -> list[str]:
    """Each line under ``roots`` that cites a document outside the repository."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path.resolve() == Path(__file__).resolve():
                continue  # the rule's own list of those documents
            for number, line in enumerate(path.read_text().splitlines(), 1):
                cited = [name for name in OUTSIDE_DOCUMENTS if name in line]
                if cited:
                    found.append(f"{path.relative_to(root.parent)}:{number} cites {cited[0]}")
    return found


def test_source_files_and_the_adapter_stay_small() -> None:
    assert size_violations(PACKAGE) == []


def test_no_module_cites_documents_outside_the_repository() -> None:
    roots = [PACKAGE, REPO / "tests", REPO / "benchmarks", REPO / "scripts"]
    assert outside_citations([root for root in roots if root.exists()]) == []


def test_the_new_rules_report_planted_violations(tmp_path: Path) -> None:
    """A long file, a long file with its reason, a fat adapter, a test importing a test, a cited design.md."""
    long_body = "x = 1\n" * MAX_LINES
    package = _write_tree(
        tmp_path,
        {
            "controller/long.py": '"""A long module."""\n' + long_body,
            "controller/reasoned.py": f'"""A state machine ({LONG_FILE_REASON} it reads top to bottom)."""\n'
            + long_body,
            "lightning/a.py": "x = 1\n" * (MAX_LIGHTNING_LINES // 2),
            "lightning/b.py": "x = 1\n" * (MAX_LIGHTNING_LINES // 2 + 1),
            "rollout/cites.py": '"""See design.md for the layout."""\n',
        },
    )
    assert [v.split(":")[0] for v in size_violations(package)] == ["sc_lightning/controller/long.py"] + [
        "sc_lightning/lightning/"
    ]
    assert outside_citations([package]) == ["sc_lightning/rollout/cites.py:1 cites design.md"]
    tests = tmp_path / "tests"
    (tests / "engines").mkdir(parents=True)
    (tests / "engines" / "test_a.py").write_text("from tests.engines.helpers import make\n")
    (tests / "engines" / "test_b.py").write_text("from tests.engines.test_a import helper\nimport tests.test_cli\n")
    assert imports_of_test_modules(tests) == [
        "tests/engines/test_b.py imports tests.engines.test_a.helper",
        "tests/engines/test_b.py imports tests.test_cli",
    ]
