"""The console a person reads: the start banner, ``fit --help`` and ``knobs``."""

from __future__ import annotations

import re

import pytest

from sc_lightning.cli import load_and_check, main
from sc_lightning.config.reference import section_summaries
from sc_lightning.config.reference_text import render_knobs
from sc_lightning.lightning.banner import RunFacts, banner
from tests.conftest import REPO
from tests.test_cli import TINY

TINY_FACTS = RunFacts(
    parameters={"policy": 84_876},
    layout="1 rank",
    device="cpu",
    devices=1,
    nodes=1,
    loggers=("CSVLogger lightning_logs/version_0",),
)


def test_the_banner_says_what_runs_where() -> None:
    config, _ = load_and_check([TINY])
    assert banner(config, TINY_FACTS) == (
        "sc_lightning grpo: builtin:tiny-arith (policy 84.9 K parameters)\n"
        "  trainer: 1 rank on cpu (1 device x 1 node), seed 7\n"
        "  generation: megatron engine in its own Ray actor\n"
        "  sampler: in_order (max_lookahead_versions 1), 8 groups x 8 generations per step, buffer 16 groups\n"
        "  data plane: memory\n"
        "  logs: CSVLogger lightning_logs/version_0\n"
        "  checkpoints: off (checkpointing.enabled: false)"
    )


def test_the_banner_names_the_endpoint_the_layout_checkpoints_and_missing_kernels() -> None:
    config, _ = load_and_check(
        [TINY, "configs/samplers/windowed.yaml"],
        ["checkpointing.enabled=true", "checkpointing.save_data_plane=true", "token_capture.enabled=true"]
        + ["rollout_checkpointing.snapshot_attempt_interval_s=30"],
    )
    facts = RunFacts(
        parameters={"policy": 1_260_000_000, "critic": 1_100_000_000},
        layout="4 ranks = TP 2 x PP 1 x DP 2",
        device="cuda",
        devices=2,
        nodes=2,
        loggers=(),
        endpoint_url="http://127.0.0.1:8123/v1",
        missing_kernels=("Apex", "Transformer Engine"),
    )
    assert banner(config, facts).splitlines()[1:] == [
        "  trainer: 4 ranks = TP 2 x PP 1 x DP 2 on cuda (2 devices x 2 nodes), seed 7",
        "  generation: megatron engine in its own Ray actor",
        "  sampler: windowed (max_staleness_versions 1), 8 groups x 8 generations per step, buffer 32 groups",
        "  data plane: memory",
        "  logs: none (trainer.logger: false)",
        "  checkpoints: results/checkpoints every 10 steps, rollout snapshots every 30 s",
        "  endpoint: http://127.0.0.1:8123/v1 (OpenAI-compatible completions)",
        "  kernels: megatron's torch fall-backs (not installed: Apex, Transformer Engine)",
    ]
    assert banner(config, facts).splitlines()[0].endswith("(policy 1.3 B, critic 1.1 B parameters)")
    colocated, _ = load_and_check([TINY, "configs/colocated.yaml"])
    assert "\n  generation: megatron engine in the trainer process (colocated, on cuda)\n" in banner(colocated, facts)


def test_fit_help_lists_every_config_section_and_points_to_knobs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", "--help"]) == 0
    out = capsys.readouterr().out
    for name, doc in [*section_summaries(), ("trainer", "Lightning's Trainer arguments")]:
        assert re.search(rf"^  {name} +{re.escape(doc)}", out, re.MULTILINE), name
    assert "python -m sc_lightning knobs SECTION" in out


def test_knobs_prints_type_default_unit_meaning_and_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["knobs", "async_rl.sampler"]) == 0
    out = capsys.readouterr().out
    assert (
        "  async_rl.sampler.max_lookahead_versions: int = 1 (weight versions)\n"
        "    How many trainer versions dispatch may run ahead; 0 is synchronous on-policy training. (>= 0)\n"
        "    rules: importance_sampling, buffer_capacity\n"
    ) in out
    assert "\n  buffer_capacity: max_buffered_rollouts must hold the sampler's window" in out
    assert "grpo.num_prompts_per_step:" not in out  # only the section asked for


def test_knobs_lists_exactly_the_knobs_of_the_config_reference() -> None:
    reference = (REPO / "docs" / "config-reference.md").read_text()
    documented = set(re.findall(r"^\| `([\w.]+)` \|", reference, re.MULTILINE))
    printed = set(re.findall(r"^  (\w+\.[\w.]+): ", render_knobs(), re.MULTILINE))
    assert printed == documented and len(printed) > 100


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["knobs", "async_rl.samplr"], "no config section or knob 'async_rl.samplr'; did you mean async_rl.sampler?"),
        (["knobs", "trainer.max_steps"], "trainer.max_steps is Lightning's"),
        (["knobs", "grpo", "ppo"], "knobs takes at most one SECTION"),
    ],
)
def test_knobs_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
