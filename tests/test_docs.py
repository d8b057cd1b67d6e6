"""Docs match the code: the generated config reference is current and the README shows the real commands."""

from __future__ import annotations

import re

import pytest

from sc_lightning.config import SECTION_NAMES
from sc_lightning.config.reference import render_reference
from tests.helpers.cli import user_environment
from tests.helpers.configs import REPO


def test_config_reference_is_current() -> None:
    current = (REPO / "docs" / "config-reference.md").read_text()
    assert current == render_reference(), (
        "regenerate: python -m sc_lightning.config.reference > docs/config-reference.md"
    )


def test_readme_quickstart_commands_exist_and_ci_runs_the_test_one() -> None:
    readme = (REPO / "README.md").read_text()
    for command in ("./scripts/run_tiny.sh", "./scripts/test.sh"):
        assert command in readme
        assert (REPO / command).is_file()
    assert "./scripts/test.sh" in (REPO / ".ci" / "run").read_text()


def test_readme_config_map_names_every_section() -> None:
    readme = (REPO / "README.md").read_text()
    missing = [name for name in SECTION_NAMES if f"`{name}`" not in readme]
    assert not missing, missing


def test_every_rule_declares_the_knobs_it_ties_and_they_exist() -> None:
    from sc_lightning.config.knobs import key_index
    from sc_lightning.config.reference import rule_ties
    from sc_lightning.config.rules import RULES
    from sc_lightning.config.schema import SCConfig

    valid = {path for paths in key_index(SCConfig).values() for path in paths}
    for rule in RULES:
        ties = rule_ties(rule)
        assert ties, f"{rule.__name__} declares no @ties(...)"
        assert set(ties) <= valid, f"{rule.__name__} ties unknown dotpaths {set(ties) - valid}"


PACKAGE_PATH = re.compile(r"sc_lightning/[\w./-]*\w/?")


def _named_package_paths(text: str) -> set[str]:
    return set(PACKAGE_PATH.findall(text))


def test_architecture_page_names_only_paths_that_exist() -> None:
    named = _named_package_paths((REPO / "docs" / "architecture.md").read_text())
    assert len(named) >= 30, sorted(named)  # it walks the step through the files
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert not missing, missing


def test_every_package_path_in_the_docs_exists() -> None:
    missing = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        missing += [f"{doc.name}: {p}" for p in _named_package_paths(doc.read_text()) if not (REPO / p).exists()]
    assert not missing, missing


def test_the_rows_table_matches_the_row_schema() -> None:
    from sc_lightning.controller.api import TRAINED_ROW

    text = (REPO / "docs" / "controller.md").read_text()
    table = text[text.index("| field | per | dtype | meaning |") :].split("\n\n")[0].splitlines()[2:]
    documented = {}
    for line in table:
        names, per, dtype = (cell.strip() for cell in line.strip("|").split("|")[:3])
        for name in re.findall(r"`(\w+)`", names):
            documented[name] = (per, dtype)
    schema = {field.name: (field.per, str(field.stored).removeprefix("torch.")) for field in TRAINED_ROW}
    assert documented == schema


@pytest.mark.slow
def test_the_readme_python_snippet_trains_with_root_imports_only(tmp_path) -> None:
    """The "Using it from Python" block, as printed (but 2 steps): it imports only from the package root, and runs."""
    import subprocess
    import sys

    readme = (REPO / "README.md").read_text()
    snippet = re.search(r"## Using it from Python\n\n```python\n(.*?)```", readme, re.S).group(1)
    imports = re.findall(r"^from (\S+) import", snippet, re.M)
    assert imports == ["lightning.pytorch", "sc_lightning"], imports  # the public surface is the package root
    assert "grpo.max_num_steps=1000" in snippet
    (tmp_path / "configs").symlink_to(REPO / "configs")
    check = "\nprint('trained steps:', trainer.global_step)\n"
    (tmp_path / "snippet.py").write_text(snippet.replace("grpo.max_num_steps=1000", "grpo.max_num_steps=2") + check)
    env = user_environment()  # a fresh process, as a user starts it
    result = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained steps: 2" in result.stdout


@pytest.mark.slow  # a child process importing Lightning, tens of seconds on 2 cores
def test_importing_the_package_loads_no_framework() -> None:
    """``import sc_lightning`` stays cheap: Lightning, Ray and megatron-core load only when a root name is used."""
    import subprocess
    import sys

    probe = (
        "import sys, sc_lightning\n"
        "heavy = [m for m in ('lightning', 'ray', 'megatron') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "sc_lightning.RefitCallback\n"
        "assert 'lightning' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
