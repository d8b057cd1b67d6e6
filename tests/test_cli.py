"""The command line: ``python -m sc_lightning fit --config ...`` run in a subprocess as users run it, and its argument
and config checks in this process."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from sc_lightning.cli.main import main
from sc_lightning.config import ConfigError
from sc_lightning.trainer.perf import SPLIT
from tests.helpers.cli import run, step_metrics
from tests.helpers.configs import REPO, TEST_BASE, TINY


@pytest.mark.slow  # a `python -m sc_lightning` process (a few seconds to start)
def test_dry_run_validates_and_starts_nothing() -> None:
    result = run("fit", "--config", TINY, "--dry_run", "true")
    assert result.returncode == 0, result.stderr
    assert "config is valid" in result.stdout and "nothing was started" in result.stdout
    assert "grpo with the in_order sampler, 8 groups x 8 generations per step" in result.stdout


CPU_CONFIGS = [
    ["configs/grpo_tiny.yaml"],
    ["configs/grpo_tiny.yaml", "configs/colocated.yaml"],
    ["configs/grpo_tiny_vllm.yaml"],
    ["configs/ppo_tiny.yaml"],
    *[
        ["configs/grpo_tiny.yaml", f"configs/samplers/{m}.yaml"]
        for m in ("in_order", "weight_fifo", "ready_first", "windowed")
    ],
]
GPU_CONFIGS = [  # GPUs, and models and datasets to download: a dry run here refuses them (tests/test_preflight.py)
    ["configs/grpo_math_1B_megatron.yaml"],
    ["configs/ppo_math_1B_megatron.yaml"],
    *[["configs/grpo_math_1B_megatron.yaml", f"configs/layouts/grpo_math_1B_{n}nodes.yaml"] for n in (2, 8)],
    ["configs/grpo_1gpu.yaml"],
    ["configs/ppo_1gpu.yaml"],
    ["configs/grpo_1gpu_long.yaml"],
]


@pytest.mark.parametrize("config", CPU_CONFIGS, ids=lambda c: c[-1].split("/")[-1])
def test_every_shipped_cpu_config_passes_a_dry_run(
    config: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In this process (a dry run starts nothing; test_dry_run_validates_and_starts_nothing runs the real command)."""
    monkeypatch.chdir(REPO)
    args = [a for path in config for a in ("--config", path)]
    assert main(["fit", *args, "--dry_run"]) == 0, capsys.readouterr().err
    assert "config is valid" in capsys.readouterr().out


@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda c: c[-1].split("/")[-1])
def test_every_shipped_gpu_config_is_valid(config: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The config itself (spec sections and trainer:); what it needs from a machine is the dry run's on a GPU box."""
    from sc_lightning.cli.load import load_and_check

    monkeypatch.chdir(REPO)
    load_and_check(config)


def test_the_long_answer_gpu_config_passes_a_dry_run_on_a_cpu(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check its header gives for a CPU box: the GPU switched off, the rest as shipped (the worked-arithmetic
    dataset and environment, the 312M warm start, the 2,056-token limits, the colocated engine)."""
    monkeypatch.chdir(REPO)
    args = ["--config", "configs/grpo_1gpu_long.yaml", "--trainer.accelerator", "cpu", "--policy.precision", "fp32"]
    assert main(["fit", *args, "--dry_run"]) == 0, capsys.readouterr().err
    assert "32 groups x 8 generations per step" in capsys.readouterr().out


@pytest.mark.slow  # a `python -m sc_lightning` process (a few seconds to start)
def test_invalid_config_fails_fast_with_every_error_and_no_traceback() -> None:
    started = time.monotonic()
    result = run(
        "fit",
        "--config",
        TINY,
        "--grpo.max_num_epochs",
        "0",
        "--async_rl.max_bufered_rollouts=3",
        "--trainer.max_step",
        "4",
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 2
    assert elapsed < 30  # before Ray, the engines or a model start (a fit's start-up takes minutes)
    assert "Traceback" not in result.stderr
    assert "async_rl.max_bufered_rollouts: unknown key; did you mean async_rl.max_buffered_rollouts?" in result.stderr
    assert "trainer.max_step: unknown Trainer argument; did you mean trainer.max_steps?" in result.stderr


@pytest.mark.slow  # a `python -m sc_lightning` process (a few seconds to start)
def test_cross_field_errors_and_trainer_errors_come_together() -> None:
    result = run("fit", "--config", TINY, "--policy.train_global_batch_size", "15", "--trainer.max_steps", "4")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "policy.train_global_batch_size: is 15" in result.stderr
    assert "trainer.max_steps: is 4 but grpo.max_num_steps is 1000" in result.stderr


def test_bundles_need_lightning_checkpointing_left_on() -> None:
    """BundleCheckpoint is a Lightning checkpoint callback: a config that turns Lightning's checkpointing off fails."""
    from sc_lightning.cli.load import load_and_check

    with pytest.raises(ConfigError, match=r"trainer.enable_checkpointing: is false but checkpointing.enabled is true"):
        load_and_check([str(REPO / TINY)], ["checkpointing.enabled=true", "trainer.enable_checkpointing=false"])
    load_and_check([str(REPO / TINY)], ["trainer.enable_checkpointing=false"])  # without bundles: the user's choice


def test_bf16_on_a_cpu_trainer_fails_before_anything_starts_naming_the_knob() -> None:
    """bf16 is GPU mixed precision (fp32 masters in megatron's optimizer): a CPU trainer asks for fp32 instead."""
    from sc_lightning.cli.load import load_and_check

    with pytest.raises(ConfigError, match=r"policy.precision: is bf16 but the trainer runs on the CPU") as caught:
        load_and_check([str(REPO / TINY)], ["policy.precision=bf16", "trainer.accelerator=cpu"])
    assert "set it to fp32" in str(caught.value)
    with pytest.raises(ConfigError, match=r"value.precision: is bf16"):
        load_and_check([str(REPO / "configs/ppo_tiny.yaml")], ["value.precision=bf16", "trainer.accelerator=cpu"])
    load_and_check([str(REPO / TINY)], ["policy.precision=bf16", "trainer.accelerator=gpu"])  # a GPU run may


def test_model_parallel_sizes_must_divide_the_trainer_world_before_anything_starts() -> None:
    """TP x PP ranks come out of trainer.devices x trainer.num_nodes: a layout that does not divide fails early."""
    from sc_lightning.cli.load import load_and_check

    knob = "policy.megatron_cfg.tensor_model_parallel_size"
    with pytest.raises(ConfigError, match=rf"{knob}: is 2 .* the trainer has 1 rank\(s\)") as caught:
        load_and_check([str(REPO / TINY)], [f"{knob}=2"])
    assert "trainer.devices 1 x trainer.num_nodes 1" in str(caught.value)
    with pytest.raises(ConfigError, match=r"value.megatron_cfg.tensor_model_parallel_size: is 4"):
        load_and_check([str(REPO / "configs/ppo_tiny.yaml")], ["value.megatron_cfg.tensor_model_parallel_size=4"])
    load_and_check([str(REPO / TINY)], [f"{knob}=2", "trainer.devices=4", "data_plane.backend=simple"])  # 2 DP x TP 2


def test_several_ranks_need_a_data_plane_they_all_reach() -> None:
    """Each rank reads its rows by key: the in-process data plane is refused; a colocated engine needs TP 1."""
    from sc_lightning.cli.load import load_and_check

    with pytest.raises(ConfigError, match=r"data_plane.backend: is memory \(in-process\) but the trainer has 2 ranks"):
        load_and_check([str(REPO / TINY)], ["trainer.devices=2"])
    tp2 = ["trainer.devices=2", "data_plane.backend=simple", "policy.megatron_cfg.tensor_model_parallel_size=2"]
    bundles = ["checkpointing.enabled=true", "checkpointing.save_data_plane=true"]
    load_and_check([str(REPO / TINY)], tp2 + bundles)  # distributed checkpoints: any layout keeps bundles
    colocated = [str(REPO / TINY), str(REPO / "configs/colocated.yaml")]
    with pytest.raises(ConfigError, match=r"the colocated Megatron engine runs in the trainer's process"):
        load_and_check(colocated, tp2)


@pytest.mark.slow  # a `python -m sc_lightning` process (a few seconds to start)
def test_trainer_types_are_checked_by_lightning() -> None:
    result = run("fit", "--config", TINY, "--trainer.max_epochs", "many", "--dry_run")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "trainer.max_epochs" in result.stderr


@pytest.mark.slow  # a `python -m sc_lightning` process (a few seconds to start)
def test_print_config_prints_the_resolved_config_which_loads_back(tmp_path) -> None:
    result = run("fit", "--config", TINY, "--grpo.max_num_steps", "7", "--print_config")
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["grpo"]["max_num_steps"] == 7
    assert printed["async_rl"]["rollout_failure"]["max_infra_attempts_per_prompt"] == 5  # a default, made explicit
    assert printed["trainer"]["accelerator"] == "cpu" and printed["seed_everything"] == 7
    saved = tmp_path / "printed.yaml"
    saved.write_text(result.stdout)
    again = run("fit", "--config", str(saved), "--print_config")
    assert again.returncode == 0 and yaml.safe_load(again.stdout) == printed


@pytest.mark.slow  # a `python -m sc_lightning` process (a few seconds to start)
def test_colocated_fit_trains_on_policy_with_a_faithful_refit(tmp_path) -> None:
    result = run(
        "fit",
        "--config",
        TINY,
        "--config",
        "configs/colocated.yaml",
        "--data_plane.backend",
        "memory",
        "--grpo.max_num_steps",
        "2",
        "--loss_fn.reference_policy_kl_penalty",
        "0.01",  # a reference logprob pass: perf/split_logprob_s times it
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "fit stopped after step 2: grpo.max_num_steps (2) reached (checkpointing is off" in result.stderr
    # the end-of-fit advice knows the run had no lookahead: it suggests one step, without "if not on"
    assert "take turns on the same devices (colocated)" in result.stderr, result.stderr[-3000:]
    assert "one step of lookahead (async_rl.sampler.max_lookahead_versions: 1) keeps" in result.stderr
    (metrics,) = tmp_path.glob("lightning_logs/version_*/metrics.csv")
    rows = metrics.read_text().splitlines()
    header = rows[0].split(",")
    expected = {"train/reward", "train/loss", "train/grad_norm", "timing/train/weight_sync", "rollout/committed_total"}
    assert expected <= set(header)
    assert "perf/tokens_per_s" in header and "perf/mfu" not in header  # no MFU without a known accelerator peak
    steps = [dict(zip(header, row.split(","), strict=True)) for row in rows[1:]]
    assert [int(r["step"]) for r in steps] == [0, 1]
    assert not list(tmp_path.rglob("*.ckpt")), "checkpointing.enabled is false: no Lightning default checkpoint"
    assert all(float(r["perf/tokens_per_s"]) > 0 for r in steps)
    # the engine's logprobs of what it sampled equal the trainer's: a faithful refit
    assert all(float(r["train/token_mult_prob_error"]) == pytest.approx(1.0, abs=1e-4) for r in steps)
    # ... for every sequence, not only on average; no grpo.seq_logprob_error_threshold: logged, nothing masked
    seq_errors = [f"train/{s}_seq_mult_prob_error{m}" for s in ("max", "mean", "min") for m in ("", "_after_mask")]
    assert all(float(r[name]) == pytest.approx(1.0, abs=1e-4) for r in steps for name in seq_errors)
    assert all(float(r["train/num_masked_seqs_by_logprob_error"]) == 0 for r in steps)
    assert all(float(r["train/masked_correct_pct"]) == 0 for r in steps)  # 0 when nothing was masked
    assert all(float(r["train/staleness_max"]) == 0 for r in steps)  # colocated and synchronous: on-policy
    for r in ({k: float(v) for k, v in row.items() if v != ""} for row in steps):
        wall = r["timing/train/total_step_time"]
        split = {part: r[f"perf/split_{part}_s"] for part in SPLIT}
        assert sum(split.values()) == pytest.approx(wall, rel=0.02)  # the split adds up to the step's wall time
        assert min(split.values()) > 0, split  # each part took time (other: Lightning's loop)
        assert split["logprob"] + split["train"] == pytest.approx(r["timing/train/policy_training"], rel=1e-6)
        # prompt + response tokens of the step's rows: what the training step ran (perf/tokens_per_s over its time)
        tokens = r["perf/step_tokens"]
        assert tokens == pytest.approx(r["perf/tokens_per_s"] * r["timing/train/policy_training"], rel=1e-6)
        assert 0 < r["perf/step_generated_tokens"] < tokens
        assert r["perf/tokens_per_s_per_gpu"] == pytest.approx(tokens / wall / 1, rel=0.02)  # NeMo-RL's, 1 device
        assert r["perf/generated_tokens_per_s"] == pytest.approx(r["perf/step_generated_tokens"] / wall, rel=0.02)


@pytest.mark.slow  # a `python -m sc_lightning` process (a few seconds to start)
def test_a_seq_logprob_error_threshold_below_every_error_stops_the_run_naming_the_knob(tmp_path) -> None:
    """A sequence's error is a mean of exp|...| >= 1, so 0.5 masks all of step 0: refused like any empty step."""
    result = run(
        "fit",
        *[arg for path in TEST_BASE for arg in ("--config", str(path))],
        "--data_plane.backend",
        "memory",
        "--grpo.max_num_steps",
        "2",
        "--grpo.seq_logprob_error_threshold",
        "0.5",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    )
    assert result.returncode != 0
    assert "RL step 0: all 16 completions were filtered out" in result.stderr
    assert "grpo.seq_logprob_error_threshold=0.5 masked 16 of 16 sequences" in result.stderr
    assert "raise grpo.seq_logprob_error_threshold, or set it to null" in result.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--config", TINY], "unknown subcommand 'train'"),
        (["fit"], "give a config: fit --config"),
        (["generate"], "give a config: generate --config"),  # each subcommand's own example
        (["validate"], "give a config: validate --config"),
        (["validate", "--config", TINY, "--dry_run"], "--dry_run is fit's option (validate always runs)"),
        (["generate", "--config", TINY, "--print_config"], "--print_config is fit's option (generate always runs)"),
        (["generate", "--config", TINY, "--output", "configs"], "--output configs is a directory; give the JSONL"),
        (["fit", "--config"], "--config needs a value"),
        (["fit", "--config", TINY, "--dry_run", "maybe"], "--dry_run takes true or false"),
        (["fit", "stray"], "unexpected argument 'stray'"),
        (["fit", "--config", "configs/nope.yaml"], "does not exist"),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("command", ["fit", "validate", "generate"])
def test_a_config_without_an_algorithm_block_is_bad_input_not_a_traceback(command: str, tmp_path, capsys) -> None:
    """Neither grpo: nor ppo: after the merge: exit code 2 naming the block (the Lightning side, whose seed default
    is the algorithm's, is not parsed; its keys are still checked)."""
    config = tmp_path / "no_algorithm.yaml"
    config.write_text("policy:\n  model_name: builtin:tiny\ntrainer:\n  no_such_argument: 1\n")
    assert main([command, "--config", str(config), *(["--dry_run"] if command == "fit" else [])]) == 2
    err = capsys.readouterr().err
    assert "grpo: a run needs a grpo: block (or a ppo: block for PPO)" in err
    assert "trainer.no_such_argument: unknown Trainer argument" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("seed", ["x", "{a: 1}"])
def test_a_seed_everything_that_is_no_int_is_named_in_plain_words(seed: str, capsys) -> None:
    assert main(["fit", "--config", TINY, "--seed_everything", seed, "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert "  - seed_everything: expected an int (or true / false), got " in err and "Parser key" not in err


def test_help(capsys) -> None:
    assert main(["--help"]) == 0
    assert "--dry_run" in capsys.readouterr().out


@pytest.mark.slow  # a `python -m sc_lightning` process (a few seconds to start)
def test_the_drain_gate_trains_no_row_spanning_two_weight_versions(tmp_path) -> None:
    """in_order with a lookahead of 1 generates the next step's groups while a step trains, so they are in flight at
    its refit; with in_flight_weight_updates false the refit waits for them, and train_data.jsonl holds no row whose
    start_weight differs from its end_weight, though rows generated a version ahead are trained."""
    result = run(
        "fit",
        "--config",
        TINY,
        "--config",
        "tests/small_steps.yaml",
        "--async_rl.max_buffered_rollouts",
        "8",
        "--async_rl.max_inflight_prompts",
        "8",
        "--async_rl.in_flight_weight_updates",
        "false",
        "--data.train_data_log",
        "true",
        "--data_plane.backend",
        "memory",
        "--grpo.max_num_steps",
        "4",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "train_data.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 16  # 4 steps x 4 groups x 4 generations
    assert [row for row in rows if row["start_weight"] != row["end_weight"]] == []
    assert any(row["step"] - row["start_weight"] == 1 for row in rows)  # generated ahead, on one version


@pytest.mark.slow  # a `python -m sc_lightning` process (a few seconds to start)
@pytest.mark.long(minutes=1.5)
def test_vllm_fit_runs_the_full_single_controller_path(tmp_path) -> None:
    """grpo_tiny_vllm.yaml for a few steps: vLLM in a Ray actor, TransferQueue, refits; the logprobs agree."""
    result = run(
        "fit",
        "--config",
        "configs/grpo_tiny_vllm.yaml",
        "--config",
        "tests/small_steps.yaml",
        "--grpo.max_num_steps",
        "3",
        "--async_rl.sampler.max_lookahead_versions",
        "0",  # on-policy, so the engine's and the trainer's logprobs must agree exactly
        "--data_plane.backend",
        "simple",  # TransferQueue on Ray, the production data plane
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.enable_progress_bar=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = step_metrics(tmp_path)
    assert [int(s["step"]) for s in steps] == [0, 1, 2]
    assert all(float(s["train/staleness_max"]) == 0 for s in steps)
    # after every refit vLLM's logprobs of what it sampled equal the trainer's: the weights arrived intact
    assert all(float(s["train/token_mult_prob_error"]) == pytest.approx(1.0, abs=1e-4) for s in steps)
