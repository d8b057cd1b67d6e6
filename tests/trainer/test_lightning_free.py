"""trainer/ is the train pump without Lightning: every module imports with the ``lightning`` package blocked."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.configs import REPO

TRAINER = REPO / "sc_lightning" / "trainer"


@pytest.mark.slow  # a child process importing every trainer module, tens of seconds
def test_every_trainer_module_imports_with_lightning_blocked() -> None:
    modules = sorted(f"sc_lightning.trainer.{p.stem}" for p in TRAINER.glob("*.py") if p.stem != "__init__")
    assert len(modules) >= 7, modules
    code = (
        "import importlib, sys\n"
        "sys.modules['lightning'] = sys.modules['pytorch_lightning'] = None  # any import of them fails\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['lightning', 'pytorch_lightning']"  # only the two blocked entries
