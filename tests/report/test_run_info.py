"""run_info.yaml holds the config exactly as ``--print_config`` renders it, and the installed library versions."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import yaml

from sc_lightning.cli.load import load_and_check, render_config
from sc_lightning.report.run_info import RUN_INFO, read_run_info, write_run_info
from tests.helpers.configs import TEST_BASE


def test_run_info_records_the_resolved_config_and_versions(tmp_path: Path) -> None:
    config, lightning = load_and_check([str(path) for path in TEST_BASE], ["grpo.max_num_steps=3"])
    path = write_run_info(tmp_path / "run", config, lightning)
    assert path == tmp_path / "run" / RUN_INFO
    info = read_run_info(path.parent)
    assert info["config"] == yaml.safe_load(render_config(config, lightning))
    assert info["config"]["grpo"]["max_num_steps"] == 3
    for name in ("torch", "lightning", "megatron-core", "sc_lightning"):
        assert info["versions"][name] == metadata.version(name)
    assert [p.name for p in path.parent.iterdir()] == [RUN_INFO]  # no temporary left behind


def test_a_missing_or_unreadable_run_info_reads_as_none(tmp_path: Path) -> None:
    assert read_run_info(tmp_path) is None
    (tmp_path / RUN_INFO).write_text("config: [unclosed\n")
    assert read_run_info(tmp_path) is None
