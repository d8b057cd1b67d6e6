"""The console a person reads: the start banner, quiet libraries, ``fit --help`` and ``knobs``."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from sc_lightning.cli.load import load_and_check
from sc_lightning.cli.main import main
from sc_lightning.config.reference import section_summaries
from sc_lightning.config.reference_text import render_knobs
from sc_lightning.console import quiet_libraries
from sc_lightning.models.spec import builtin_spec
from sc_lightning.rollout_side.banner import RunFacts, banner
from tests.helpers.cli import run, user_environment
from tests.helpers.configs import REPO, TINY
from tests.helpers.ports import free_port

CHILD_WARNINGS = "ignore:Transformer Engine and Apex are not installed,ignore:Apex is not installed"
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


def test_the_banner_states_the_architecture_and_the_vocabularys_padding_for_tensor_parallelism() -> None:
    """The model: line names the architecture, the vocabulary and its embedding rows at the TP size (the padding
    never sampled or trained), and the tokenizer."""
    spec = builtin_spec("builtin:tiny").replace(vocab_size=19, arch="qwen3", qkv_bias=False)
    facts = dataclasses.replace(TINY_FACTS, spec=spec, tokenizer="/m (chat template)")
    config, _ = load_and_check([TINY])
    assert banner(config, facts).splitlines()[1] == (
        "  model: Qwen3ForCausalLM, vocabulary 19 (19 embedding rows at TP 1); tokenizer /m (chat template)"
    )
    two_ranks = ["policy.megatron_cfg.tensor_model_parallel_size=2", "trainer.devices=2", "data_plane.backend=simple"]
    tp2, _ = load_and_check([TINY], two_ranks)
    assert "vocabulary 19 (20 embedding rows at TP 2: the padding rows are never sampled or trained)" in (
        banner(tp2, facts)
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
    capped, _ = load_and_check(
        [TINY, "configs/samplers/windowed.yaml"],
        ["async_rl.sampler.over_sampling_ratio=1.5", "async_rl.in_flight_weight_updates=false"],
    )
    assert (
        "\n  sampler: windowed (max_staleness_versions 1, over_sampling_ratio 1.5), 8 groups x 8 generations per "
        "step, buffer 32 groups; each refit drains the rollouts in flight\n"
    ) in banner(capped, facts)
    external, _ = load_and_check(
        [TINY],
        [
            "env.name=external",
            "policy.generation.mcore_generation_config.expose_http_server=true",
            "async_rl.rollout_failure.rollout_timeout_s=600",
        ],
    )
    assert "endpoint: http://127.0.0.1:8123/v1 (OpenAI-compatible completions; agents take rollouts from " in (
        banner(external, facts)
    )


def test_quieting_drops_the_known_noise_and_nothing_else(caplog: pytest.LogCaptureFixture) -> None:
    environ: dict[str, str] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_libraries(environ)
        warnings.warn("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.", stacklevel=1)
        warnings.warn("Apex is not installed. Falling back to Torch Norm", stacklevel=1)
        warnings.warn("something a user should see", stacklevel=1)
    assert [str(w.message) for w in caught] == ["something a user should see"]
    assert environ == {"RAY_LOGGER_LEVEL": "error", "PYTHONWARNINGS": CHILD_WARNINGS}
    lightning = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        lightning.info("GPU available: False, used: False")
        lightning.info("\nDetected KeyboardInterrupt, attempting graceful shutdown ...")  # the CLI says `interrupted`
        lightning.info("`Trainer.fit` stopped: `max_epochs=1` reached.")  # FitStop's line says the real reason
        lightning.info("Restoring states from the checkpoint path at ckpt")
    assert [r.getMessage() for r in caplog.records] == ["Restoring states from the checkpoint path at ckpt"]


def test_processes_ray_starts_inherit_the_quiet_warnings() -> None:
    """Ray's actors import megatron in processes of their own: the PYTHONWARNINGS they inherit drop its warnings."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    quiet_libraries(environ)
    code = "import warnings; warnings.warn('Apex is not installed. Falling back to Torch Norm'); warnings.warn('kept')"
    child = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    assert "Apex" not in child.stderr and "UserWarning: kept" in child.stderr


def test_a_users_settings_and_verbose_mode_win() -> None:
    environ = {"RAY_LOGGER_LEVEL": "info", "PYTHONWARNINGS": "error"}
    quiet_libraries(environ)
    quiet_libraries(environ)  # each trainer rank runs the CLI again, with the environment it inherited
    assert environ == {"RAY_LOGGER_LEVEL": "info", "PYTHONWARNINGS": f"error,{CHILD_WARNINGS}"}
    verbose = {"SC_LIGHTNING_VERBOSE": "1"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_libraries(verbose)
        warnings.warn("Apex is not installed. Falling back to Torch Norm", stacklevel=1)
    assert len(caught) == 1 and verbose == {"SC_LIGHTNING_VERBOSE": "1"}


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


@pytest.mark.slow
def test_the_first_40_lines_of_a_tiny_run_hold_the_banner_and_no_noise(tmp_path: Path) -> None:
    """The command scripts/run_tiny.sh runs (one step, serving the endpoint on a pinned port), stdout and stderr as
    a terminal interleaves them: the banner, no traceback, no library warning, no line said twice but the bar's."""
    port = free_port()
    env = user_environment(without=("RAY_LOGGER_LEVEL",))
    result = subprocess.run(
        [sys.executable, "-m", "sc_lightning", "fit", "--config", TINY, "--grpo.max_num_steps=1"]
        + [f"--trainer.default_root_dir={tmp_path}", "--policy.generation.mcore_generation_config.expose_http_server"]
        + ["true", f"--policy.generation.mcore_generation_config.http_port={port}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    first = result.stdout.splitlines()[:40]
    text = "\n".join(first)
    assert "sc_lightning grpo: builtin:tiny-arith (policy 84.9 K parameters)\n" in text
    assert "\n  model: Qwen2ForCausalLM, vocabulary 18 (18 embedding rows at TP 1); tokenizer " in text  # README's
    assert f"\n  logs: CSVLogger {tmp_path}/lightning_logs/version_0\n" in text
    assert f"\n  endpoint: http://127.0.0.1:{port}/v1 (OpenAI-compatible completions)\n" in text
    for noise in ("Traceback", "Warning", "warnings.warn", "Apex", "Ray instance", "Token authentication", "Tip:"):
        assert noise not in text, noise
    said = [line.strip() for line in first if line.strip() and not set(line.strip()) <= set("━─│┃┏┓┗┛┡┩└┘")]
    assert len(said) == len(set(said)), said


@pytest.mark.slow
def test_a_checkpoint_that_does_not_fit_ends_the_run_in_one_error_line(tmp_path: Path) -> None:
    """Saved by megatron's distributed optimizer, resumed without it: exit 3, the fix named, no traceback."""
    quick = ["--config", "configs/colocated.yaml", "--trainer.enable_progress_bar=false"]
    quick += ["--checkpointing.enabled=true", "--checkpointing.save_data_plane=true", "--checkpointing.save_period=1"]
    quick += [f"--checkpointing.checkpoint_dir={tmp_path}/checkpoints", f"--trainer.default_root_dir={tmp_path}"]
    sliced = "--policy.megatron_cfg.use_distributed_optimizer"
    first = run("fit", "--config", TINY, *quick, "--grpo.max_num_steps=1", f"{sliced}=true")
    assert first.returncode == 0, first.stderr[-3000:]
    second = run("fit", "--config", TINY, *quick, "--grpo.max_num_steps=2", f"{sliced}=false")
    assert second.returncode == 3, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    (error,) = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith(f"error: cannot resume: {tmp_path}/checkpoints/step_1/sharded: policy's optimizer state")
    assert error.endswith(
        "use_distributed_optimizer (policy's, value's for the critic) set to true, as in the run that saved it"
    )
